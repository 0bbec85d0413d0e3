#include "cluster/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"
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

// A message too long for a client's trailer limit is cut, whole characters kept, with a note.
TEST(GrpcStatus, LongMessagesAreCutAtACharacterBoundary) {
  const std::string exact(kMaxStatusMessageBytes, 'a');
  EXPECT_EQ(ToGrpc(absl::DeadlineExceededError(exact)).error_message(), exact);
  for (const std::string unit : {"x", "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80"}) {
    std::string long_message = "missing workers: ";
    while (long_message.size() < 20000) long_message += unit;
    const grpc::Status g = ToGrpc(absl::DeadlineExceededError(long_message));
    EXPECT_EQ(g.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
    const std::string& m = g.error_message();
    EXPECT_LE(m.size(), kMaxStatusMessageBytes) << unit.size();
    EXPECT_EQ(m.rfind("missing workers: ", 0), 0u);
    const size_t note = m.find(" [");
    ASSERT_NE(note, std::string::npos);
    EXPECT_EQ((note - 17) % unit.size(), 0u) << "a character was split: " << unit.size();
    EXPECT_EQ(m.substr(note), absl::StrCat(" [", long_message.size() - note, " more bytes cut]"));
  }
}

TEST(GrpcStatus, ContextPrefixesTheMessageOfErrorsOnly) {
  const grpc::Status unavailable(grpc::StatusCode::UNAVAILABLE, "connection refused");
  const absl::Status s = FromGrpc(unavailable, "PushPull to shard 1 (127.0.0.1:7070)");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "PushPull to shard 1 (127.0.0.1:7070): connection refused");
  EXPECT_TRUE(FromGrpc(grpc::Status::OK, "PushPull").ok());
}

TEST(GrpcStatus, BusyRefusalsAreTheOnesThatPass) {
  const auto exhausted = [](const char* m) {
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, m);
  };
  EXPECT_TRUE(IsBusyRefusal(exhausted("Server Threadpool Exhausted")));
  EXPECT_TRUE(IsBusyRefusal(
      exhausted("client ipv4:1.2.3.4:5 already has 6 calls in flight on this shard (limit)")));
  EXPECT_TRUE(IsBusyRefusal(exhausted(
      "client address 1.2.3.4 left replies unread on this shard (more than 128 at once, or "
      "one for 30s): its calls are refused for 29s (replies unread)")));
  EXPECT_FALSE(IsBusyRefusal(exhausted("memory budget of 1 GiB is used up")));
  EXPECT_FALSE(IsBusyRefusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, "(replies unread)")));
}

}  // namespace
}  // namespace gcomp::cluster
