#include "server/unread_replies.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

using ::testing::HasSubstr;

// Counts its cancellations; may end its call from inside Cancel, as gRPC can.
class FakeReply final : public UnreadReplies::Reply {
 public:
  explicit FakeReply(std::function<void()> on_cancel = nullptr)
      : on_cancel_(std::move(on_cancel)) {}
  void Cancel() override {
    ++cancels;
    if (on_cancel_) on_cancel_();
  }
  std::atomic<int> cancels{0};

 private:
  std::function<void()> on_cancel_;
};

UnreadReplies::Options Small() {
  UnreadReplies::Options o;
  o.max_per_address = 3;
  o.timeout = absl::Seconds(10);
  return o;
}

TEST(UnreadRepliesTest, AddressIsThePeersHostWithoutPort) {
  EXPECT_EQ(UnreadReplies::AddressOf("ipv4:10.0.0.7:51234"), "10.0.0.7");
  EXPECT_EQ(UnreadReplies::AddressOf("ipv6:[::1]:51234"), "[::1]");
  EXPECT_EQ(UnreadReplies::AddressOf("ipv6:%5B::1%5D:5"), "%5B::1%5D");
  EXPECT_EQ(UnreadReplies::AddressOf("unix:/tmp/s"), "unix:/tmp/s");
  EXPECT_EQ(UnreadReplies::AddressOf("nothing"), "nothing");
}

TEST(UnreadRepliesTest, RepliesThatEndAreForgotten) {
  UnreadReplies r(Small());
  for (int i = 0; i < 100; ++i) {
    const uint64_t id = r.Begin("ipv4:10.0.0.1:1", std::make_shared<FakeReply>());
    r.End(id);
  }
  EXPECT_EQ(r.unread(), 0u);
  EXPECT_EQ(r.cancelled(), 0u);
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.1:1").ok());
  EXPECT_EQ(r.CancelOverdue(absl::Now() + absl::Hours(1)), 0u);
}

TEST(UnreadRepliesTest, MoreThanTheBoundFromOneAddressCancelsThemAllAndRefusesIt) {
  uint64_t reported = 0;
  UnreadReplies::Options o = Small();
  o.on_cancelled = [&reported](uint64_t n) { reported += n; };
  UnreadReplies r(o);
  std::vector<std::shared_ptr<FakeReply>> held;
  // Three unread replies, each on its own connection of one host: within the bound.
  for (int port = 1; port <= 3; ++port) {
    held.push_back(std::make_shared<FakeReply>());
    r.Begin("ipv4:10.0.0.1:" + std::to_string(port), held.back());
  }
  auto other = std::make_shared<FakeReply>();
  r.Begin("ipv4:10.0.0.2:1", other);
  for (const auto& h : held) EXPECT_EQ(h->cancels, 0);
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.1:9").ok());
  // The fourth is one too many: all four are cancelled, the other host's reply is not.
  held.push_back(std::make_shared<FakeReply>());
  r.Begin("ipv4:10.0.0.1:4", held.back());
  for (const auto& h : held) EXPECT_EQ(h->cancels, 1);
  EXPECT_EQ(other->cancels, 0);
  EXPECT_EQ(r.cancelled(), 4u);
  EXPECT_EQ(reported, 4u);
  const absl::Status refused = r.Admit("ipv4:10.0.0.1:77");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("client address 10.0.0.1 left replies unread"));
  EXPECT_THAT(refused.message(), HasSubstr("more than 3 at once"));
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.2:1").ok());
  // Refused for the timeout, then admitted again.
  EXPECT_FALSE(r.Admit("ipv4:10.0.0.1:1", absl::Now() + absl::Seconds(9)).ok());
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.1:1", absl::Now() + absl::Seconds(11)).ok());
  // A cancelled reply is not cancelled again.
  r.Begin("ipv4:10.0.0.1:5", std::make_shared<FakeReply>());
  for (const auto& h : held) EXPECT_EQ(h->cancels, 1);
}

TEST(UnreadRepliesTest, ARepliesUnreadPastTheTimeoutIsCancelledOnce) {
  UnreadReplies r(Small());
  auto old_reply = std::make_shared<FakeReply>();
  const uint64_t old_id = r.Begin("ipv4:10.0.0.1:1", old_reply);
  EXPECT_EQ(r.CancelOverdue(absl::Now() + absl::Seconds(5)), 0u);
  EXPECT_EQ(r.CancelOverdue(absl::Now() + absl::Seconds(11)), 1u);
  EXPECT_EQ(old_reply->cancels, 1);
  EXPECT_EQ(r.CancelOverdue(absl::Now() + absl::Seconds(12)), 0u);
  EXPECT_EQ(old_reply->cancels, 1);
  EXPECT_FALSE(r.Admit("ipv4:10.0.0.1:2", absl::Now() + absl::Seconds(12)).ok());
  r.End(old_id);
  EXPECT_EQ(r.unread(), 0u);
}

TEST(UnreadRepliesTest, ACancelThatEndsItsCallAtOnceDoesNotDeadlock) {
  UnreadReplies r(Small());
  std::vector<uint64_t> ids(4, 0);
  for (int i = 0; i < 4; ++i) {
    ids[i] = r.Begin("ipv4:10.0.0.1:1", std::make_shared<FakeReply>([&r, &ids, i] {
                       if (ids[i] != 0) r.End(ids[i]);
                     }));
  }
  // The fourth Begin cancelled all four; the first three ended inside Cancel.
  EXPECT_EQ(r.unread(), 1u);
  r.End(ids[3]);
  EXPECT_EQ(r.unread(), 0u);
}

TEST(UnreadRepliesTest, TheWatchdogCancelsOverdueReplies) {
  UnreadReplies::Options o = Small();
  o.timeout = absl::Milliseconds(200);
  UnreadReplies r(o);
  r.StartWatchdog();
  auto reply = std::make_shared<FakeReply>();
  r.Begin("ipv4:10.0.0.1:1", reply);
  for (absl::Time give_up = absl::Now() + absl::Seconds(20);
       reply->cancels == 0 && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(reply->cancels, 1);
}

}  // namespace
}  // namespace gcomp::server
