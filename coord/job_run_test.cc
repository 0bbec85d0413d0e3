#include "coord/job_run.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "coord/map_record.h"
#include "coord/memory_store.h"
#include "gtest/gtest.h"

namespace gcomp::coord {
namespace {

constexpr char kJob[] = "run-job";

// A shard process as EnterRun sees it: a lease and its member record under it.
struct Shard {
  uint32_t index = 0;
  LeaseId lease = kNoLease;
  proto::MemberRecord member;
};

Shard Register(MemoryStore* store, uint32_t k) {
  Shard s;
  s.index = k;
  s.lease = *store->GrantLease(absl::Seconds(5));
  s.member.set_address(absl::StrCat("127.0.0.1:", 7000 + k));
  s.member.set_incarnation(k + 1);
  EXPECT_TRUE(RegisterMember(store, kJob, k, s.member, s.lease).ok());
  return s;
}

absl::StatusOr<RunEntry> Enter(MemoryStore* store, Shard* s, const std::string& set = "") {
  return EnterRun(store, kJob, s->index, &s->member, s->lease,
                  [set]() -> absl::StatusOr<std::string> { return set; });
}

TEST(JobRun, FirstShardStartsARunTheOthersEnterIt) {
  MemoryStore store;
  Shard a = Register(&store, 0), b = Register(&store, 1), c = Register(&store, 2);
  absl::StatusOr<RunEntry> ea = Enter(&store, &a, "step-8");
  ASSERT_TRUE(ea.ok()) << ea.status();
  EXPECT_EQ(ea->kind, RunEntry::Kind::kStarted);
  EXPECT_EQ(ea->run.generation(), 1u);
  EXPECT_EQ(ea->run.restore_set(), "step-8");
  EXPECT_EQ(a.member.generation(), 1u);
  // The others enter the run a started, restoring its set, not their own newest.
  for (Shard* s : {&b, &c}) {
    absl::StatusOr<RunEntry> e = Enter(&store, s, "step-12");
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ(e->kind, RunEntry::Kind::kEntered);
    EXPECT_EQ(e->run.restore_set(), "step-8");
    EXPECT_EQ(s->member.generation(), 1u);
  }
  absl::StatusOr<proto::RunRecord> run = ReadRun(&store, kJob);
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->entered_size(), 3);
  // The member records carry the generation, as written in the same transaction.
  absl::StatusOr<std::map<uint32_t, proto::MemberRecord>> members = ReadMembers(&store, kJob);
  ASSERT_TRUE(members.ok());
  for (const auto& [k, m] : *members) EXPECT_EQ(m.generation(), 1u) << k;
}

TEST(JobRun, AShardRestartedWhileTheRunGoesOnRejoins) {
  MemoryStore store;
  Shard a = Register(&store, 0), b = Register(&store, 1);
  ASSERT_TRUE(Enter(&store, &a).ok());
  ASSERT_TRUE(Enter(&store, &b).ok());
  store.ExpireLease(b.lease);  // killed
  Shard again = Register(&store, 1);
  absl::StatusOr<RunEntry> e = Enter(&store, &again, "step-4");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, RunEntry::Kind::kRejoin);
  EXPECT_EQ(e->run.generation(), 1u);
  EXPECT_EQ(again.member.generation(), 0u);  // not serving until taken back
}

// The case that never served with the peer protocol: every shard stopped, then all started
// again (from checkpoints). The first one up finds nobody serving and starts run 2; the
// others, though they entered run 1, enter run 2 and restore its set.
TEST(JobRun, AWholeJobRestartStartsTheNextRun) {
  MemoryStore store;
  std::vector<Shard> shards;
  for (uint32_t k = 0; k < 3; ++k) shards.push_back(Register(&store, k));
  for (Shard& s : shards) ASSERT_TRUE(Enter(&store, &s, "").ok());
  for (Shard& s : shards) store.ExpireLease(s.lease);
  std::vector<Shard> restarted;
  for (uint32_t k : {2u, 0u, 1u}) restarted.push_back(Register(&store, k));
  std::vector<RunEntry::Kind> kinds;
  for (Shard& s : restarted) {
    absl::StatusOr<RunEntry> e = Enter(&store, &s, absl::StrCat("set-of-shard-", s.index));
    ASSERT_TRUE(e.ok()) << e.status();
    kinds.push_back(e->kind);
    EXPECT_EQ(e->run.generation(), 2u);
    EXPECT_EQ(e->run.restore_set(), "set-of-shard-2");
  }
  EXPECT_EQ(kinds, (std::vector<RunEntry::Kind>{RunEntry::Kind::kStarted, RunEntry::Kind::kEntered,
                                                RunEntry::Kind::kEntered}));
}

// A shard stuck rejoining is not "serving": if every serving shard stops meanwhile, asking
// again starts the next run instead of waiting for a coordinator that is gone.
TEST(JobRun, ARejoiningShardWhoseRunEndedStartsTheNext) {
  MemoryStore store;
  Shard a = Register(&store, 0), b = Register(&store, 1);
  ASSERT_TRUE(Enter(&store, &a).ok());
  ASSERT_TRUE(Enter(&store, &b).ok());
  store.ExpireLease(b.lease);
  Shard b2 = Register(&store, 1);
  ASSERT_EQ(Enter(&store, &b2)->kind, RunEntry::Kind::kRejoin);
  store.ExpireLease(a.lease);
  absl::StatusOr<RunEntry> e = Enter(&store, &b2, "step-2");
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->kind, RunEntry::Kind::kStarted);
  EXPECT_EQ(e->run.generation(), 2u);
  // The first shard back enters run 2 (it is not in its list), it does not rejoin.
  Shard a2 = Register(&store, 0);
  EXPECT_EQ(Enter(&store, &a2)->kind, RunEntry::Kind::kEntered);
}

// Shards started at once: exactly one starts the run, whatever the interleaving.
TEST(JobRun, ConcurrentStartsMakeOneRun) {
  for (int round = 0; round < 20; ++round) {
    MemoryStore store;
    std::vector<Shard> shards;
    for (uint32_t k = 0; k < 4; ++k) shards.push_back(Register(&store, k));
    std::vector<absl::StatusOr<RunEntry>> got(4, absl::UnknownError("not run"));
    std::vector<std::thread> threads;
    for (uint32_t k = 0; k < 4; ++k) {
      threads.emplace_back([&, k] { got[k] = Enter(&store, &shards[k], absl::StrCat("s", k)); });
    }
    for (auto& t : threads) t.join();
    int started = 0;
    std::string set;
    for (const auto& e : got) {
      ASSERT_TRUE(e.ok()) << e.status();
      EXPECT_NE(e->kind, RunEntry::Kind::kRejoin);
      started += e->kind == RunEntry::Kind::kStarted;
      if (set.empty()) set = e->run.restore_set();
      EXPECT_EQ(e->run.restore_set(), set);
      EXPECT_EQ(e->run.generation(), 1u);
    }
    EXPECT_EQ(started, 1) << "round " << round;
  }
}

TEST(JobRun, AMemberRecordOfAnotherLeaseIsRefused) {
  MemoryStore store;
  Shard a = Register(&store, 0);
  Shard impostor = a;
  impostor.lease = *store.GrantLease(absl::Seconds(5));
  absl::StatusOr<RunEntry> e = Enter(&store, &impostor);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kFailedPrecondition) << e.status();
}

TEST(JobRun, AGarbledRunRecordIsDataLoss) {
  MemoryStore store;
  Txn txn;
  txn.puts.push_back({JobKeys(kJob).run, "\xff\xff not a record", kNoLease});
  ASSERT_TRUE(store.Commit(txn).ok());
  Shard a = Register(&store, 0);
  absl::StatusOr<RunEntry> e = Enter(&store, &a);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kDataLoss) << e.status();
  EXPECT_NE(std::string(e.status().message()).find("/gcomp/run-job/run"), std::string::npos);
}

}  // namespace
}  // namespace gcomp::coord
