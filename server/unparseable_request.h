// What a caller hears when its request does not parse as the method's protobuf message.
#ifndef GCOMP_SERVER_UNPARSEABLE_REQUEST_H_
#define GCOMP_SERVER_UNPARSEABLE_REQUEST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/support/server_interceptor.h"

namespace gcomp::server {

// Such a request reaches no handler, and gRPC answers it INTERNAL with an empty message:
// to the caller and in the shard's metrics that reads as a shard bug. This interceptor
// turns exactly that answer into INVALID_ARGUMENT naming the method. Methods listed in
// `skip` (PushPull: it parses its own bytes and names what is wrong) and streaming methods
// get no interceptor, so their calls pay nothing for it.
class UnparseableRequestInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit UnparseableRequestInterceptorFactory(std::vector<std::string> skip = {})
      : skip_(std::move(skip)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const std::vector<std::string> skip_;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_UNPARSEABLE_REQUEST_H_
