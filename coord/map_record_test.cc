// The shard-map record and the coordinator's election against real etcd: one map, changed
// only by compare-and-swap; a deposed coordinator's decision is refused.
#include "coord/map_record.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coord/election.h"
#include "coord/etcd_process.h"
#include "coord/etcd_store.h"
#include "gtest/gtest.h"

namespace gcomp::coord {
namespace {

class MapRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<EtcdCluster>> c = EtcdCluster::Start({});
    ASSERT_TRUE(c.ok()) << c.status();
    cluster_ = *std::move(c);
    EtcdStoreOptions o;
    o.endpoints = cluster_->endpoints();
    store_ = *EtcdStore::Create(o);
  }

  static proto::ShardMapRecord Map(uint64_t epoch, int shards, uint32_t replicas = 2) {
    proto::ShardMapRecord r;
    r.set_epoch(epoch);
    for (int i = 0; i < shards; ++i) r.add_shards(absl::StrCat("127.0.0.1:", 7000 + i));
    r.set_replicas(replicas);
    return r;
  }

  std::unique_ptr<EtcdCluster> cluster_;
  std::unique_ptr<EtcdStore> store_;
};

TEST_F(MapRecordTest, ValidateNamesTheField) {
  auto check = [](proto::ShardMapRecord r, absl::string_view field) {
    absl::Status s = ValidateMap(r);
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(absl::StrCat("'", field, "'")), std::string::npos) << s;
  };
  EXPECT_TRUE(ValidateMap(Map(1, 3)).ok());
  check(Map(0, 3), "epoch");
  check(Map(1, 0, 0), "shards");
  proto::ShardMapRecord r = Map(1, 3);
  r.set_shards(2, r.shards(0));
  check(r, "shards");
  check(Map(1, 2, 3), "replicas");
  r = Map(1, 3);
  r.add_down_shards(3);
  check(r, "down_shards");
  r = Map(1, 2);
  r.add_down_shards(0);
  r.add_down_shards(1);
  check(r, "down_shards");
  r = Map(1, 3);
  r.add_down_shards(1);
  r.add_joining_shards(1);
  check(r, "joining_shards");
}

// A store whose first transactions time out: applied or not, the caller cannot tell.
class LateStore final : public Store {
 public:
  LateStore(Store* real, int lost, bool applied) : real_(real), lost_(lost), applied_(applied) {}
  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key) override {
    return real_->Get(key);
  }
  absl::StatusOr<std::vector<KeyValue>> GetPrefix(const std::string& prefix) override {
    return real_->GetPrefix(prefix);
  }
  absl::StatusOr<TxnResult> Commit(const Txn& txn) override {
    ++commits_;
    if (lost_ == 0) return real_->Commit(txn);
    --lost_;
    if (applied_) real_->Commit(txn).IgnoreError();
    return absl::UnavailableError("etcd transaction's outcome unknown");
  }
  absl::StatusOr<LeaseId> GrantLease(absl::Duration ttl) override { return real_->GrantLease(ttl); }
  absl::StatusOr<absl::Duration> KeepAlive(LeaseId lease) override {
    return real_->KeepAlive(lease);
  }
  absl::Status Revoke(LeaseId lease) override { return real_->Revoke(lease); }
  absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(
      const std::string& prefix, int64_t after_revision,
      std::function<void(const WatchEvent&)> on_event,
      std::function<void(const absl::Status&)> on_error) override {
    return real_->WatchPrefix(prefix, after_revision, std::move(on_event), std::move(on_error));
  }
  int commits() const { return commits_; }

 private:
  Store* const real_;
  int lost_;
  const bool applied_;
  int commits_ = 0;
};

// A shard's start used to fail on one late answer (a loaded etcd): creating the map is
// idempotent, so an unknown outcome is read back and tried again.
TEST_F(MapRecordTest, CreatingTheMapSurvivesAnswersThatCameTooLate) {
  LateStore applied(store_.get(), 1, /*applied=*/true);
  absl::StatusOr<VersionedMap> m = CreateMapIfAbsent(&applied, "late1", Map(1, 3));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->record.shards_size(), 3);
  EXPECT_EQ(applied.commits(), 1);  // read back, not sent again
  LateStore lost(store_.get(), 2, /*applied=*/false);
  m = CreateMapIfAbsent(&lost, "late2", Map(1, 4));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->record.shards_size(), 4);
  EXPECT_EQ(lost.commits(), 3);
  // Past the attempts, the error is the caller's.
  LateStore gone(store_.get(), 100, /*applied=*/false);
  m = CreateMapIfAbsent(&gone, "late3", Map(1, 4));
  EXPECT_TRUE(absl::IsUnavailable(m.status())) << m.status();
  EXPECT_FALSE(ReadMap(store_.get(), "late3")->has_value());
}

TEST_F(MapRecordTest, FirstMapIsCreatedOnceAndUpdatesAreCompareAndSwap) {
  EXPECT_FALSE(ReadMap(store_.get(), "job")->has_value());
  absl::StatusOr<VersionedMap> first = CreateMapIfAbsent(store_.get(), "job", Map(1, 3));
  ASSERT_TRUE(first.ok()) << first.status();
  // A second creator (another shard starting) gets the map in force, not its own.
  absl::StatusOr<VersionedMap> again = CreateMapIfAbsent(store_.get(), "job", Map(1, 4));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->record.shards_size(), 3);
  EXPECT_EQ(again->revision, first->revision);

  proto::ShardMapRecord down = first->record;
  down.set_epoch(2);
  down.add_down_shards(1);
  absl::StatusOr<VersionedMap> second = UpdateMap(store_.get(), "job", *first, down, nullptr);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_GT(second->revision, first->revision);
  // A writer that decided on the first map loses: no split brain.
  proto::ShardMapRecord other = first->record;
  other.set_epoch(2);
  other.add_down_shards(2);
  absl::Status lost = UpdateMap(store_.get(), "job", *first, other, nullptr).status();
  EXPECT_TRUE(absl::IsAborted(lost)) << lost;
  absl::StatusOr<std::optional<VersionedMap>> now = ReadMap(store_.get(), "job");
  ASSERT_TRUE(now.ok() && now->has_value());
  EXPECT_EQ((*now)->record.epoch(), 2u);
  ASSERT_EQ((*now)->record.down_shards_size(), 1);
  EXPECT_EQ((*now)->record.down_shards(0), 1u);
  // The epoch only rises.
  EXPECT_TRUE(absl::IsInvalidArgument(
      UpdateMap(store_.get(), "job", **now, (*now)->record, nullptr).status()));
  // Another job's map is its own.
  EXPECT_FALSE(ReadMap(store_.get(), "job2")->has_value());
}

TEST_F(MapRecordTest, GarbageAtTheMapKeyIsDataLossNamingIt) {
  Txn t;
  t.puts.push_back({JobKeys("job").map, "\xff\xff not a record", kNoLease});
  ASSERT_TRUE(store_->Commit(t)->committed);
  absl::Status s = ReadMap(store_.get(), "job").status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("/gcomp/job/map"), std::string::npos) << s;
}

TEST_F(MapRecordTest, MembersLiveWithTheirLeaseAndAnIndexIsHeldOnce) {
  LeaseKeeperOptions lo;
  lo.ttl = absl::Seconds(2);
  auto a = LeaseKeeper::Start(store_.get(), lo);
  auto b = LeaseKeeper::Start(store_.get(), lo);
  ASSERT_TRUE(a.ok() && b.ok());
  proto::MemberRecord m;
  m.set_address("127.0.0.1:7000");
  m.set_incarnation(1);
  ASSERT_TRUE(RegisterMember(store_.get(), "job", 0, m, (*a)->id()).ok());
  EXPECT_TRUE(RegisterMember(store_.get(), "job", 0, m, (*a)->id()).ok());  // idempotent
  m.set_incarnation(2);
  absl::Status dup = RegisterMember(store_.get(), "job", 0, m, (*b)->id());
  EXPECT_TRUE(absl::IsAlreadyExists(dup)) << dup;
  EXPECT_NE(dup.message().find("incarnation 1"), std::string::npos) << dup;
  ASSERT_TRUE(RegisterMember(store_.get(), "job", 1, m, (*b)->id()).ok());
  auto members = ReadMembers(store_.get(), "job");
  ASSERT_TRUE(members.ok());
  EXPECT_EQ(members->size(), 2u);
  a->reset();  // shard 0's process ends: its record goes with its lease
  members = ReadMembers(store_.get(), "job");
  ASSERT_EQ(members->size(), 1u);
  EXPECT_EQ(members->begin()->first, 1u);
}

// Two coordinators: one leads; when its lease is gone the other takes over, and a decision
// the first one computed before it noticed is refused by the store.
TEST_F(MapRecordTest, OneCoordinatorAtATimeAndADeposedOneCannotWrite) {
  LeaseKeeperOptions lo;
  lo.ttl = absl::Seconds(1);
  auto lease_a = LeaseKeeper::Start(store_.get(), lo);
  auto lease_b = LeaseKeeper::Start(store_.get(), lo);
  ASSERT_TRUE(lease_a.ok() && lease_b.ok());
  const std::string key = JobKeys("job").coordinator;
  Election a(store_.get(), key, "shard-0", lease_a->get());
  Election b(store_.get(), key, "shard-1", lease_b->get());
  absl::StatusOr<std::optional<Leadership>> la = a.TryAcquire();
  ASSERT_TRUE(la.ok() && la->has_value()) << la.status();
  absl::StatusOr<std::optional<Leadership>> lb = b.TryAcquire();
  ASSERT_TRUE(lb.ok());
  EXPECT_FALSE(lb->has_value());
  EXPECT_EQ((*a.Leader())->value, "shard-0");
  // Leading again is idempotent.
  absl::StatusOr<std::optional<Leadership>> la2 = a.TryAcquire();
  ASSERT_TRUE(la2.ok() && la2->has_value());
  EXPECT_EQ((*la2)->revision, (*la)->revision);

  absl::StatusOr<VersionedMap> base = CreateMapIfAbsent(store_.get(), "job", Map(1, 3));
  ASSERT_TRUE(base.ok());
  proto::ShardMapRecord decided = base->record;  // A decides on epoch 2, then stalls
  decided.set_epoch(2);
  decided.add_down_shards(2);

  lease_a->reset();  // A's lease ends (revoked here; a stall past its TTL ends it likewise)
  absl::StatusOr<Leadership> won = b.Campaign(absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(won.ok()) << won.status();
  EXPECT_EQ((*b.Leader())->value, "shard-1");

  absl::Status stale = UpdateMap(store_.get(), "job", *base, decided, &**la).status();
  EXPECT_TRUE(absl::IsAborted(stale)) << stale;
  EXPECT_EQ((*ReadMap(store_.get(), "job"))->record.epoch(), 1u);
  // The new leader's decision on the same base goes through.
  EXPECT_TRUE(UpdateMap(store_.get(), "job", *base, decided, &*won).ok());
  ASSERT_TRUE(b.Resign(*won).ok());
  EXPECT_FALSE(b.Leader()->has_value());
}

}  // namespace
}  // namespace gcomp::coord
