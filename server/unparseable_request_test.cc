#include "server/unparseable_request.h"

#include <memory>
#include <string>
#include <vector>

#include "cluster/testing/raw_unary_call.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"

namespace gcomp::server {
namespace {

using ::gcomp::testing::RawUnaryCall;
using ::testing::HasSubstr;

constexpr char kPing[] = "/gcomp.proto.Admin/Ping";

// Answers "pong", or INTERNAL (a handler's own failure) when asked from "fail".
class PingService final : public proto::Admin::Service {
  grpc::Status Ping(grpc::ServerContext*, const proto::PingRequest* request,
                    proto::PingResponse* response) override {
    if (request->from() == "fail") return grpc::Status(grpc::StatusCode::INTERNAL, "it broke");
    response->set_process("pong");
    return grpc::Status::OK;
  }
};

class UnparseableRequestTest : public ::testing::Test {
 protected:
  void Start(std::vector<std::string> skip) {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> f;
    f.push_back(std::make_unique<UnparseableRequestInterceptorFactory>(std::move(skip)));
    builder.experimental().SetInterceptorCreators(std::move(f));
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }
  ~UnparseableRequestTest() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  static std::string Serialized(const std::string& from) {
    proto::PingRequest r;
    r.set_from(from);
    return r.SerializeAsString();
  }

  PingService service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(UnparseableRequestTest, BytesThatDoNotParseAreInvalidArgumentNamingTheMethod) {
  Start({});
  // A truncated varint tag, a field 1 longer than the message, and proto3 string bytes that
  // are not UTF-8 (which protobuf refuses to parse).
  for (const std::string& bytes :
       {std::string("\xff\xff\xff"), std::string("\x0a\x7f") + "ab", Serialized("\xc3\x28")}) {
    grpc::Status s = RawUnaryCall(channel_, kPing, bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("the request to /gcomp.proto.Admin/Ping does not "
                                             "parse as that method's protobuf message"));
  }
  // Well-formed calls are untouched, and so is a handler's own INTERNAL.
  EXPECT_TRUE(RawUnaryCall(channel_, kPing, Serialized("me")).ok());
  grpc::Status failed = RawUnaryCall(channel_, kPing, Serialized("fail"));
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_EQ(failed.error_message(), "it broke");
}

TEST_F(UnparseableRequestTest, SkippedMethodsKeepGrpcsOwnAnswer) {
  Start({kPing});
  grpc::Status s = RawUnaryCall(channel_, kPing, "\xff\xff\xff");
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INTERNAL);
  EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr("does not parse")));
}

}  // namespace
}  // namespace gcomp::server
