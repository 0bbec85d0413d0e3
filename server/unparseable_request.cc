#include "server/unparseable_request.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gcomp::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

class UnparseableRequestInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit UnparseableRequestInterceptor(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // A unary call's message is deserialized before this hook: no message means it failed
    // to parse (or a quota refused the call before parsing; its status is not INTERNAL).
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE)) {
      unparsed_ = methods->GetRecvMessage() == nullptr;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        methods->GetSendStatus().error_code() == grpc::StatusCode::INTERNAL) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the request to ", method_,
                       " does not parse as that method's protobuf message (a client built "
                       "from another version of the service's .proto, or not a gcomp-ps "
                       "client?)")));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* UnparseableRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) return nullptr;
  const std::string method = info->method() == nullptr ? "" : info->method();
  if (std::find(skip_.begin(), skip_.end(), method) != skip_.end()) return nullptr;
  return new UnparseableRequestInterceptor(method);
}

}  // namespace gcomp::server
