// LeaseKeeper against real etcd: renewal, fencing when the store cannot be reached (its
// members paused, as a partition looks from this side), revocation at the end.
#include "coord/lease_keeper.h"

#include <atomic>

#include "absl/time/clock.h"
#include "coord/etcd_process.h"
#include "coord/etcd_store.h"
#include "gtest/gtest.h"

namespace gcomp::coord {
namespace {

struct Env {
  std::unique_ptr<EtcdCluster> cluster;
  std::unique_ptr<EtcdStore> store;
};

Env Start() {
  Env e;
  absl::StatusOr<std::unique_ptr<EtcdCluster>> c = EtcdCluster::Start({});
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return e;
  e.cluster = *std::move(c);
  EtcdStoreOptions o;
  o.endpoints = e.cluster->endpoints();
  o.request_timeout = absl::Milliseconds(500);
  e.store = *EtcdStore::Create(o);
  return e;
}

bool KeyExists(Store* s, const std::string& key) {
  absl::StatusOr<std::optional<KeyValue>> kv = s->Get(key);
  return kv.ok() && kv->has_value();
}

// A keeper with `ttl` that counts its losses in *lost, and the key /member bound to it.
std::unique_ptr<LeaseKeeper> KeeperHoldingMember(Store* store, absl::Duration ttl,
                                                 std::atomic<int>* lost) {
  LeaseKeeperOptions o;
  o.ttl = ttl;
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> keeper =
      LeaseKeeper::Start(store, o, [lost] { ++*lost; });
  EXPECT_TRUE(keeper.ok()) << keeper.status();
  if (!keeper.ok()) return nullptr;
  Txn t;
  t.puts.push_back({"/member", "me", (*keeper)->id()});
  absl::StatusOr<TxnResult> r = store->Commit(t);
  EXPECT_TRUE(r.ok() && r->committed);
  return *std::move(keeper);
}

TEST(LeaseKeeper, OptionsAreChecked) {
  Env e = Start();
  ASSERT_NE(e.store, nullptr);
  LeaseKeeperOptions o;
  o.ttl = absl::Milliseconds(500);
  EXPECT_TRUE(absl::IsInvalidArgument(LeaseKeeper::Start(e.store.get(), o).status()));
  o.ttl = absl::Seconds(2);
  o.margin = absl::Seconds(1);
  EXPECT_TRUE(absl::IsInvalidArgument(LeaseKeeper::Start(e.store.get(), o).status()));
}

TEST(LeaseKeeper, RenewedLeaseOutlivesItsTtlAndIsRevokedAtTheEnd) {
  Env e = Start();
  ASSERT_NE(e.store, nullptr);
  const absl::Duration ttl = absl::Seconds(1);
  std::atomic<int> lost{0};
  std::unique_ptr<LeaseKeeper> keeper = KeeperHoldingMember(e.store.get(), ttl, &lost);
  ASSERT_NE(keeper, nullptr);
  for (int i = 0; i < 6; ++i) {  // three TTLs
    absl::SleepFor(absl::Milliseconds(500));
    EXPECT_TRUE(keeper->Valid());
    EXPECT_TRUE(KeyExists(e.store.get(), "/member"));
  }
  EXPECT_EQ(lost.load(), 0);
  keeper.reset();
  EXPECT_FALSE(KeyExists(e.store.get(), "/member"));  // revoked, not left to expire
}

// The store stops answering for longer than the TTL (members paused: a partition as the
// shard sees it): Valid() turns false by the proven expiry, on_lost runs once, and the
// lease stays lost after the store comes back, its keys gone.
TEST(LeaseKeeper, UnreachableStoreFencesTheHolderByTheTtl) {
  Env e = Start();
  ASSERT_NE(e.store, nullptr);
  const absl::Duration ttl = absl::Seconds(2);
  std::atomic<int> lost{0};
  std::unique_ptr<LeaseKeeper> keeper = KeeperHoldingMember(e.store.get(), ttl, &lost);
  ASSERT_NE(keeper, nullptr);
  absl::SleepFor(absl::Milliseconds(300));
  ASSERT_TRUE(keeper->Valid());
  const absl::Time paused = absl::Now();
  e.cluster->Pause(0);
  while (keeper->Valid() && absl::Now() - paused < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  const absl::Duration fenced_after = absl::Now() - paused;
  EXPECT_FALSE(keeper->Valid());
  EXPECT_LE(fenced_after, ttl) << "still valid after the lease could have expired";
  absl::SleepFor(absl::Seconds(1));
  EXPECT_EQ(lost.load(), 1);
  EXPECT_TRUE(keeper->lost());
  e.cluster->Resume(0);
  // etcd expires the lease once it runs again and sees it unrenewed.
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  while (KeyExists(e.store.get(), "/member") && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_FALSE(KeyExists(e.store.get(), "/member"));
  EXPECT_FALSE(keeper->Valid());
  EXPECT_EQ(lost.load(), 1);
}

// The holder itself is paused (a SIGSTOPped shard): when it runs again past the TTL,
// Valid() is false before any renewal is attempted.
TEST(LeaseKeeper, HolderThatStallsPastTheTtlIsNotValidWhenItWakes) {
  Env e = Start();
  ASSERT_NE(e.store, nullptr);
  LeaseKeeperOptions o;
  o.ttl = absl::Seconds(1);
  o.renew_every = absl::Seconds(5);  // renewals cannot keep up: as if the holder stalled
  absl::StatusOr<std::unique_ptr<LeaseKeeper>> started = LeaseKeeper::Start(e.store.get(), o);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<LeaseKeeper> keeper = *std::move(started);
  EXPECT_TRUE(keeper->Valid());
  EXPECT_GT(keeper->Remaining(), absl::ZeroDuration());
  absl::SleepFor(absl::Milliseconds(1100));
  EXPECT_FALSE(keeper->Valid());
  EXPECT_EQ(keeper->Remaining(), absl::ZeroDuration());
}

}  // namespace
}  // namespace gcomp::coord
