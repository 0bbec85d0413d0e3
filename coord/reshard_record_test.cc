#include "coord/reshard_record.h"

#include <memory>

#include "absl/strings/str_cat.h"
#include "coord/election.h"
#include "coord/lease_keeper.h"
#include "coord/map_record.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"

namespace gcomp::coord {
namespace {

constexpr char kJob[] = "reshard-job";

proto::ReshardRecord Request(uint64_t epoch, int shards) {
  proto::ReshardRecord r;
  r.set_phase(proto::ReshardRecord::REQUESTED);
  r.mutable_next()->set_job(kJob);
  r.mutable_next()->set_shard_map_epoch(epoch);
  for (int i = 0; i < shards; ++i) r.mutable_next()->add_shards(absl::StrCat("127.0.0.1:", 7000 + i));
  r.set_requested_by("test");
  return r;
}

class ReshardRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    LeaseKeeperOptions o;
    o.ttl = absl::Seconds(5);
    lease_ = *LeaseKeeper::Start(&store_, o);
    election_ = std::make_unique<Election>(&store_, JobKeys(kJob).coordinator, "shard 0", lease_.get());
    leader_ = **election_->TryAcquire();
  }

  MemoryStore store_;
  std::unique_ptr<LeaseKeeper> lease_;
  std::unique_ptr<Election> election_;
  Leadership leader_;
};

TEST_F(ReshardRecordTest, ARequestIsWrittenOnceAndAskingAgainIsTheSameRequest) {
  EXPECT_FALSE(ReadReshard(&store_, kJob)->has_value());
  absl::StatusOr<VersionedReshard> first = RequestReshard(&store_, kJob, Request(2, 4));
  ASSERT_TRUE(first.ok()) << first.status();
  // Every shard's config watcher and the admin may ask for the same epoch: one request.
  proto::ReshardRecord again_request = Request(2, 4);
  again_request.set_requested_by("shard 2");
  absl::StatusOr<VersionedReshard> again = RequestReshard(&store_, kJob, again_request);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->revision, first->revision);
  EXPECT_EQ(again->record.requested_by(), "test");
  // Another epoch while this one is not finished is refused, naming the one under way.
  absl::Status other = RequestReshard(&store_, kJob, Request(3, 5)).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(other)) << other;
  EXPECT_NE(other.message().find("epoch 2 is REQUESTED"), absl::string_view::npos) << other;
}

TEST_F(ReshardRecordTest, TheCoordinatorsWritesNeedTheRevisionAndItsLeadership) {
  absl::StatusOr<VersionedReshard> asked = RequestReshard(&store_, kJob, Request(2, 4));
  ASSERT_TRUE(asked.ok());
  proto::ReshardRecord committed = asked->record;
  committed.set_phase(proto::ReshardRecord::COMMITTED);
  committed.set_switch_step(17);
  absl::StatusOr<VersionedReshard> c = UpdateReshard(&store_, kJob, *asked, committed, leader_);
  ASSERT_TRUE(c.ok()) << c.status();
  // A write based on the old revision loses: two coordinators never both decide.
  proto::ReshardRecord stale = asked->record;
  stale.set_phase(proto::ReshardRecord::FAILED);
  EXPECT_TRUE(absl::IsAborted(UpdateReshard(&store_, kJob, *asked, stale, leader_).status()));
  // A deposed coordinator's write loses too.
  Leadership deposed = leader_;
  deposed.revision += 1000;
  proto::ReshardRecord done = c->record;
  done.set_phase(proto::ReshardRecord::DONE);
  EXPECT_TRUE(absl::IsAborted(UpdateReshard(&store_, kJob, *c, done, deposed).status()));
  absl::StatusOr<std::optional<VersionedReshard>> now = ReadReshard(&store_, kJob);
  ASSERT_TRUE(now.ok() && now->has_value());
  EXPECT_EQ((*now)->record.phase(), proto::ReshardRecord::COMMITTED);
  EXPECT_EQ((*now)->record.switch_step(), 17);
  EXPECT_FALSE(Finished((*now)->record));
  // Committed and not finished: no other re-shard may be asked for.
  EXPECT_TRUE(absl::IsFailedPrecondition(RequestReshard(&store_, kJob, Request(3, 5)).status()));
  ASSERT_TRUE(UpdateReshard(&store_, kJob, **now, done, leader_).ok());
  // Finished: the next one may be asked for.
  absl::StatusOr<VersionedReshard> next = RequestReshard(&store_, kJob, Request(3, 5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->record.next().shard_map_epoch(), 3u);
}

TEST_F(ReshardRecordTest, AFailedRequestMayBeAskedForAgain) {
  absl::StatusOr<VersionedReshard> asked = RequestReshard(&store_, kJob, Request(2, 4));
  ASSERT_TRUE(asked.ok());
  proto::ReshardRecord failed = asked->record;
  failed.set_phase(proto::ReshardRecord::FAILED);
  failed.set_error("added shard 127.0.0.1:7003 did not come up");
  ASSERT_TRUE(UpdateReshard(&store_, kJob, *asked, failed, leader_).ok());
  absl::StatusOr<VersionedReshard> retried = RequestReshard(&store_, kJob, Request(2, 4));
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->record.phase(), proto::ReshardRecord::REQUESTED);
  EXPECT_TRUE(retried->record.error().empty());
}

TEST_F(ReshardRecordTest, BadRecordsAndRequestsAreNamed) {
  EXPECT_TRUE(absl::IsInvalidArgument(RequestReshard(&store_, kJob, proto::ReshardRecord()).status()));
  Txn t;
  t.puts.push_back({JobKeys(kJob).reshard, "\xff\xff not a record", kNoLease});
  ASSERT_TRUE(store_.Commit(t).ok());
  absl::Status s = ReadReshard(&store_, kJob).status();
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("/gcomp/reshard-job/reshard"), absl::string_view::npos) << s;
}

}  // namespace
}  // namespace gcomp::coord
