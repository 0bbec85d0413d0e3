#include "cluster/grpc_status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/status.pb.h"

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
  // Marked where the refusal is made, carried by the status detail, whatever its words.
  const absl::Status busy = BusyRefusal("client ipv4:1.2.3.4:5 already has 6 calls (limit)");
  EXPECT_EQ(busy.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(IsBusyRefusal(busy));
  const grpc::Status sent = ToGrpc(busy);
  EXPECT_FALSE(sent.error_details().empty());
  EXPECT_TRUE(IsBusyRefusal(sent));
  EXPECT_EQ(sent.error_message(), busy.message());
  // Across a second hop (a shard passing a peer's refusal on) the mark stays.
  EXPECT_TRUE(IsBusyRefusal(ToGrpc(FromGrpc(sent, "Replicate to shard 2"))));
  // Its bytes are google.rpc.Status with one google.rpc.RetryInfo.
  proto::RpcStatus details;
  ASSERT_TRUE(details.ParseFromString(sent.error_details()));
  EXPECT_EQ(details.code(), static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED));
  ASSERT_EQ(details.details_size(), 1);
  EXPECT_EQ(details.details(0).type_url(), "type.googleapis.com/google.rpc.RetryInfo");

  // Words alone do not make a refusal retryable, whoever writes them (a hostile peer).
  EXPECT_FALSE(IsBusyRefusal(exhausted("already has 6 calls in flight on this shard (limit)")));
  EXPECT_FALSE(IsBusyRefusal(exhausted("memory budget of 1 GiB is used up")));
  EXPECT_FALSE(IsBusyRefusal(absl::ResourceExhaustedError("memory budget of 1 GiB is used up")));
  // A detail that does not parse is no mark either.
  EXPECT_FALSE(IsBusyRefusal(
      grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "x", std::string("\xff\xff\x01", 3))));
  // The detail makes only RESOURCE_EXHAUSTED retryable here.
  EXPECT_FALSE(IsBusyRefusal(grpc::Status(grpc::StatusCode::UNAVAILABLE, "x", sent.error_details())));
  // gRPC's own refusal when every request thread is taken has no detail: its text is the sign.
  EXPECT_TRUE(IsBusyRefusal(exhausted("Server Threadpool Exhausted")));
}

}  // namespace
}  // namespace gcomp::cluster
