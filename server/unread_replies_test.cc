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
  o.min_age = absl::Seconds(1);
  o.timeout = absl::Seconds(10);
  o.first_refusal = absl::Seconds(1);
  return o;
}

TEST(UnreadRepliesTest, RepliesThatEndAreForgotten) {
  UnreadReplies r(Small());
  for (int i = 0; i < 100; ++i) {
    const uint64_t id = r.Begin("ipv4:10.0.0.1:1", std::make_shared<FakeReply>());
    r.End(id);
  }
  EXPECT_EQ(r.unread(), 0u);
  EXPECT_EQ(r.Sweep(absl::Now() + absl::Hours(1)), 0u);
  EXPECT_EQ(r.cancelled(), 0u);
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.1:1").ok());
}

TEST(UnreadRepliesTest, MoreThanTheBoundFromOneAddressForMinAgeAreCancelledAndRefused) {
  uint64_t reported = 0;
  UnreadReplies::Options o = Small();
  o.on_cancelled = [&reported](uint64_t n) { reported += n; };
  UnreadReplies r(o);
  std::vector<std::shared_ptr<FakeReply>> held;
  // Three unread replies of one host, each on its own connection, then (100 ms later) one
  // more of it and one of another host.
  for (int port = 1; port <= 3; ++port) {
    held.push_back(std::make_shared<FakeReply>());
    r.Begin("ipv4:10.0.0.1:" + std::to_string(port), held.back());
  }
  const absl::Time begun = absl::Now();
  absl::SleepFor(absl::Milliseconds(100));
  held.push_back(std::make_shared<FakeReply>());
  r.Begin("ipv4:10.0.0.1:4", held.back());
  auto other = std::make_shared<FakeReply>();
  r.Begin("ipv4:10.0.0.2:1", other);
  // Over the bound but younger than min_age: a burst being read, left alone.
  EXPECT_EQ(r.Sweep(begun + absl::Milliseconds(500)), 0u);
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.1:9", begun + absl::Milliseconds(500)).ok());
  // The host's oldest past min_age: all four of its replies cancelled (the newest too), the
  // other host's reply (younger than min_age) not.
  const absl::Time swept = begun + absl::Milliseconds(1050);
  EXPECT_EQ(r.Sweep(swept), 4u);
  for (const auto& h : held) EXPECT_EQ(h->cancels, 1);
  EXPECT_EQ(other->cancels, 0);
  EXPECT_EQ(r.cancelled(), 4u);
  EXPECT_EQ(reported, 4u);
  const absl::Status refused = r.Admit("ipv4:10.0.0.1:77", swept);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("client address 10.0.0.1 left replies unread"));
  EXPECT_THAT(refused.message(), HasSubstr("more than 3 for 1s"));
  EXPECT_THAT(refused.message(), HasSubstr("refused for another 1s (replies unread)"));
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.2:1", swept).ok());
  // The first refusal lasts first_refusal.
  EXPECT_FALSE(r.Admit("ipv4:10.0.0.1:1", swept + absl::Milliseconds(900)).ok());
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.1:1", swept + absl::Milliseconds(1100)).ok());
  // A cancelled reply is not cancelled again.
  EXPECT_EQ(r.Sweep(swept + absl::Seconds(2)), 0u);
  for (const auto& h : held) EXPECT_EQ(h->cancels, 1);
}

// Two addresses each under the bound, over it together: the replies that waited min_age go,
// fresh ones stay.
TEST(UnreadRepliesTest, AddressesUnderTheBoundTogetherOverItLoseTheirOldReplies) {
  UnreadReplies r(Small());
  std::vector<std::shared_ptr<FakeReply>> old_replies;
  for (const char* peer : {"ipv4:10.0.0.1:1", "ipv4:10.0.0.1:2", "ipv4:10.0.0.2:1"}) {
    old_replies.push_back(std::make_shared<FakeReply>());
    r.Begin(peer, old_replies.back());
  }
  const absl::Time begun = absl::Now();
  EXPECT_EQ(r.Sweep(begun + absl::Seconds(2)), 0u);  // 3 in all: within the bound
  auto fresh = std::make_shared<FakeReply>();
  absl::SleepFor(absl::Milliseconds(20));
  r.Begin("ipv4:10.0.0.3:1", fresh);
  // 4 in all; the first three waited past min_age by then, the fourth did not.
  EXPECT_EQ(r.Sweep(begun + absl::Seconds(1) + absl::Milliseconds(10)), 3u);
  for (const auto& o : old_replies) EXPECT_EQ(o->cancels, 1);
  EXPECT_EQ(fresh->cancels, 0);
  EXPECT_FALSE(r.Admit("ipv4:10.0.0.1:9", begun + absl::Seconds(1) + absl::Milliseconds(20)).ok());
  EXPECT_FALSE(r.Admit("ipv4:10.0.0.2:9", begun + absl::Seconds(1) + absl::Milliseconds(20)).ok());
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.3:9", begun + absl::Seconds(1) + absl::Milliseconds(20)).ok());
}

TEST(UnreadRepliesTest, RepeatedOffencesAreRefusedLongerUpToTheTimeout) {
  UnreadReplies r(Small());
  absl::Time t = absl::Now() + absl::Seconds(2);
  std::vector<absl::Duration> refusals;
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 4; ++i) r.Begin("ipv4:10.0.0.1:1", std::make_shared<FakeReply>());
    ASSERT_EQ(r.Sweep(t), 4u);
    absl::Duration refused = absl::ZeroDuration();
    while (!r.Admit("ipv4:10.0.0.1:1", t + refused).ok()) refused += absl::Milliseconds(100);
    refusals.push_back(refused);
    t += refused + absl::Seconds(2);  // the next offence within `timeout` of this one
  }
  EXPECT_EQ(refusals,
            (std::vector<absl::Duration>{absl::Seconds(1), absl::Seconds(2), absl::Seconds(4),
                                         absl::Seconds(8), absl::Seconds(10), absl::Seconds(10)}));
  // Forgiven after `timeout` without an offence: back to the first refusal.
  t += absl::Seconds(25);
  for (int i = 0; i < 4; ++i) r.Begin("ipv4:10.0.0.1:1", std::make_shared<FakeReply>());
  ASSERT_EQ(r.Sweep(t), 4u);
  EXPECT_FALSE(r.Admit("ipv4:10.0.0.1:1", t + absl::Milliseconds(900)).ok());
  EXPECT_TRUE(r.Admit("ipv4:10.0.0.1:1", t + absl::Milliseconds(1100)).ok());
}

TEST(UnreadRepliesTest, AReplyUnreadPastTheTimeoutIsCancelledOnce) {
  UnreadReplies r(Small());
  auto old_reply = std::make_shared<FakeReply>();
  const uint64_t old_id = r.Begin("ipv4:10.0.0.1:1", old_reply);
  EXPECT_EQ(r.Sweep(absl::Now() + absl::Seconds(5)), 0u);
  const absl::Time swept = absl::Now() + absl::Seconds(11);
  EXPECT_EQ(r.Sweep(swept), 1u);
  EXPECT_EQ(old_reply->cancels, 1);
  EXPECT_EQ(r.Sweep(swept + absl::Seconds(1)), 0u);
  EXPECT_EQ(old_reply->cancels, 1);
  EXPECT_FALSE(r.Admit("ipv4:10.0.0.1:2", swept + absl::Milliseconds(500)).ok());
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
  EXPECT_EQ(r.Sweep(absl::Now() + absl::Seconds(2)), 4u);
  EXPECT_EQ(r.unread(), 0u);
}

TEST(UnreadRepliesTest, TheWatchdogCancelsOverdueReplies) {
  UnreadReplies::Options o = Small();
  o.timeout = absl::Milliseconds(200);
  o.sweep_every = absl::Milliseconds(20);
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
