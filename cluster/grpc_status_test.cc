#include "cluster/grpc_status.h"

#include "gtest/gtest.h"

namespace gcomp::cluster {
namespace {

TEST(GrpcStatus, EveryCodeAndMessageSurvivesTheRoundTrip) {
  for (int code = 0; code <= 16; ++code) {
    const absl::Status s(static_cast<absl::StatusCode>(code), code ? "what went wrong" : "");
    const grpc::Status g = ToGrpc(s);
    EXPECT_EQ(static_cast<int>(g.error_code()), code);
    EXPECT_EQ(FromGrpc(g), s) << code;
  }
}

TEST(GrpcStatus, ContextPrefixesTheMessageOfErrorsOnly) {
  const grpc::Status unavailable(grpc::StatusCode::UNAVAILABLE, "connection refused");
  const absl::Status s = FromGrpc(unavailable, "PushPull to shard 1 (127.0.0.1:7070)");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "PushPull to shard 1 (127.0.0.1:7070): connection refused");
  EXPECT_TRUE(FromGrpc(grpc::Status::OK, "PushPull").ok());
}

}  // namespace
}  // namespace gcomp::cluster
