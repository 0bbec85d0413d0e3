// A unary call whose request is the given bytes, not a serialized message: for tests of
// what a server answers to bytes no generated stub would send.
#ifndef GCOMP_CLUSTER_TESTING_RAW_UNARY_CALL_H_
#define GCOMP_CLUSTER_TESTING_RAW_UNARY_CALL_H_

#include <chrono>
#include <future>
#include <memory>
#include <string>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace gcomp::testing {

inline grpc::Status RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& method, const std::string& bytes,
                                 std::chrono::seconds timeout = std::chrono::seconds(10)) {
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

}  // namespace gcomp::testing

#endif  // GCOMP_CLUSTER_TESTING_RAW_UNARY_CALL_H_
