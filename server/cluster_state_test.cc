// ClusterState over the in-memory store (coord/memory_store.h): registration, fencing,
// election, compare-and-swap of the map, lost members. The same class against real etcd
// and real shard processes: tests/coordination_test.cc.
#include "server/cluster_state.h"

#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

proto::ClusterConfig Config(int shards) {
  proto::ClusterConfig c;
  c.set_job("job");
  c.set_workers(1);
  for (int i = 0; i < shards; ++i) c.add_shards(absl::StrCat("127.0.0.1:", 7000 + i));
  c.set_shard_map_epoch(1);
  c.set_replicas(2);
  c.mutable_coordination()->set_lease_ttl_ms(1000);
  c.mutable_coordination()->set_request_timeout_ms(200);
  return c;
}

struct Events {
  absl::Mutex mu;
  std::vector<uint64_t> maps ABSL_GUARDED_BY(mu);
  std::vector<uint32_t> lost ABSL_GUARDED_BY(mu);
};

std::unique_ptr<ClusterState> JoinAs(uint32_t shard, std::shared_ptr<coord::MemoryStore> store,
                                     Events* events, int shards = 3) {
  ClusterStateOptions o;
  o.shard = shard;
  o.tick = absl::Milliseconds(50);
  if (events != nullptr) {
    o.on_map = [events](const proto::ShardMapRecord& r) {
      absl::MutexLock l(&events->mu);
      events->maps.push_back(r.epoch());
    };
    o.on_member_lost = [events](uint32_t k, const std::string&) {
      absl::MutexLock l(&events->mu);
      events->lost.push_back(k);
    };
  }
  absl::StatusOr<std::unique_ptr<ClusterState>> s = ClusterState::Join(Config(shards), o, store);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

template <typename Pred>
bool Eventually(Pred pred, absl::Duration timeout = absl::Seconds(5)) {
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return pred();
}

TEST(ClusterState, JoinRegistersAndTheFirstMapIsWrittenOnce) {
  auto store = std::make_shared<coord::MemoryStore>();
  auto a = JoinAs(0, store, nullptr);
  auto b = JoinAs(1, store, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_TRUE(a->CheckLease().ok());
  EXPECT_EQ(a->map().record.epoch(), 1u);
  EXPECT_EQ(a->map().revision, b->map().revision);
  EXPECT_TRUE(Eventually([&] { return a->IsLive(1) && b->IsLive(0); }));
  EXPECT_FALSE(a->IsLive(2));
  EXPECT_EQ(store->GetPrefix("/gcomp/job/members/")->size(), 2u);
  b.reset();  // a clean stop revokes the lease: the record goes at once
  EXPECT_TRUE(Eventually([&] { return !a->IsLive(1); }));
}

TEST(ClusterState, ASecondProcessAsTheSameShardIsRefused) {
  auto store = std::make_shared<coord::MemoryStore>();
  auto a = JoinAs(0, store, nullptr);
  ASSERT_NE(a, nullptr);
  ClusterStateOptions o;
  o.shard = 0;
  absl::Status s = ClusterState::Join(Config(3), o, store).status();
  EXPECT_TRUE(absl::IsAlreadyExists(s)) << s;
  EXPECT_NE(s.message().find("two processes were started as the same shard"), std::string::npos) << s;
}

TEST(ClusterState, OneCoordinatorAndOnlyItsDecisionCommits) {
  auto store = std::make_shared<coord::MemoryStore>();
  Events ea, eb;
  auto a = JoinAs(0, store, &ea);
  auto b = JoinAs(1, store, &eb);
  auto c = JoinAs(2, store, nullptr);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(Eventually([&] { return a->Leader().has_value() && b->Leader() == a->Leader() &&
                                      c->Leader() == a->Leader(); }));
  ClusterState* leader = *a->Leader() == 0 ? a.get() : *a->Leader() == 1 ? b.get() : c.get();
  ClusterState* other = leader == a.get() ? b.get() : a.get();
  const proto::ClusterConfig from = Config(3);
  proto::ClusterConfig next = from;
  next.set_shard_map_epoch(2);
  next.add_down_shards(2);
  absl::Status refused = other->CommitMap(from, next);
  EXPECT_TRUE(absl::IsAborted(refused)) << refused;
  EXPECT_NE(refused.message().find("is not the coordinator"), std::string::npos) << refused;
  ASSERT_TRUE(leader->CommitMap(from, next).ok());
  // The same decision again, on the map it replaced: refused, the record moved on.
  next.set_shard_map_epoch(2);
  EXPECT_TRUE(absl::IsAborted(leader->CommitMap(from, next)));
  EXPECT_EQ(other->map().record.epoch(), 2u);
  // The non-coordinators hear of it through the watch.
  Events& heard = other == a.get() ? ea : eb;
  EXPECT_TRUE(Eventually([&] {
    absl::MutexLock l(&heard.mu);
    return !heard.maps.empty() && heard.maps.back() == 2;
  }));
  // Shard 2 is down in the committed map: it acknowledges nothing.
  EXPECT_TRUE(Eventually([&] { return !c->CheckLease().ok(); }));
  EXPECT_NE(c->CheckLease().message().find("down in the committed map"), std::string::npos);
}

// The store unreachable past the TTL (a partition as the shard sees it): fenced within
// the TTL; back once it can register again.
TEST(ClusterState, AShardCutOffFromTheStoreFencesItselfAndComesBack) {
  auto store = std::make_shared<coord::MemoryStore>();
  auto a = JoinAs(0, store, nullptr);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(a->CheckLease().ok());
  const coord::LeaseId first = a->lease();
  store->SetUnreachable(true);
  const absl::Time cut = absl::Now();
  ASSERT_TRUE(Eventually([&] { return !a->CheckLease().ok(); }));
  EXPECT_LE(absl::Now() - cut, absl::Seconds(1) + absl::Milliseconds(100));
  EXPECT_NE(a->CheckLease().message().find("holds no valid lease"), std::string::npos);
  store->ExpireLease(first);  // what etcd does meanwhile
  store->SetUnreachable(false);
  EXPECT_TRUE(Eventually([&] { return a->CheckLease().ok(); }));
  EXPECT_NE(a->lease(), first);
}

TEST(ClusterState, TheCoordinatorIsToldOfAMemberWhoseLeaseEnded) {
  auto store = std::make_shared<coord::MemoryStore>();
  Events e0;
  auto a = JoinAs(0, store, &e0);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(Eventually([&] { return a->Leader() == 0u; }));
  auto b = JoinAs(1, store, nullptr);
  auto c = JoinAs(2, store, nullptr);
  ASSERT_TRUE(Eventually([&] { return a->IsLive(1) && a->IsLive(2); }));
  store->ExpireLease(c->lease());  // shard 2 stops renewing: paused, partitioned, killed
  EXPECT_TRUE(Eventually([&] {
    absl::MutexLock l(&e0.mu);
    return std::find(e0.lost.begin(), e0.lost.end(), 2u) != e0.lost.end();
  }));
  absl::MutexLock l(&e0.mu);
  EXPECT_EQ(std::count(e0.lost.begin(), e0.lost.end(), 1u), 0);
}

// Whoever can write to etcd can write anything: short, foreign or corrupt values at the
// job's keys are ignored, never a crash.
TEST(ClusterState, GarbageInTheStoreIsIgnored) {
  auto store = std::make_shared<coord::MemoryStore>();
  auto a = JoinAs(0, store, nullptr);
  ASSERT_NE(a, nullptr);
  const coord::JobKeys keys("job");
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{keys.coordinator, "x"},
                                                        {keys.coordinator, "shard "},
                                                        {keys.coordinator, "shard 99999999999"},
                                                        {keys.map, "\x01\x02garbage"},
                                                        {keys.Member(7), "\xff"},
                                                        {keys.members + "nan", "x"}}) {
    coord::Txn t;
    t.puts.push_back({key, value, coord::kNoLease});
    ASSERT_TRUE(store->Commit(t)->committed);
  }
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_TRUE(a->CheckLease().ok());
  EXPECT_EQ(a->map().record.epoch(), 1u);
  EXPECT_FALSE(a->Leader().has_value() && *a->Leader() > 2);
}

}  // namespace
}  // namespace gcomp::server
