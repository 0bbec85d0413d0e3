#include "coord/job_run.h"

#include <algorithm>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coord/map_record.h"

namespace gcomp::coord {
namespace {

constexpr int kTries = 20;

}  // namespace

const char* RunEntryKindName(RunEntry::Kind kind) {
  switch (kind) {
    case RunEntry::Kind::kStarted:
      return "started the run";
    case RunEntry::Kind::kEntered:
      return "entered the run";
    case RunEntry::Kind::kRejoin:
      return "rejoins the running job";
  }
  return "?";
}

absl::StatusOr<proto::RunRecord> ReadRun(Store* store, const std::string& job) {
  const JobKeys keys(job);
  absl::StatusOr<std::optional<KeyValue>> kv = store->Get(keys.run);
  if (!kv.ok()) return kv.status();
  proto::RunRecord run;
  if (kv->has_value() && (!run.ParseFromString((*kv)->value) || run.generation() == 0)) {
    return absl::DataLossError(
        absl::StrCat("the run record at ", keys.run, " does not parse as a RunRecord"));
  }
  return run;
}

absl::StatusOr<RunEntry> EnterRun(Store* store, const std::string& job, uint32_t shard,
                                  proto::MemberRecord* member, LeaseId lease,
                                  const std::function<absl::StatusOr<std::string>()>& newest_set) {
  const JobKeys keys(job);
  for (int attempt = 0; attempt < kTries; ++attempt) {
    absl::StatusOr<std::optional<KeyValue>> kv = store->Get(keys.run);
    if (!kv.ok()) return kv.status();
    const int64_t revision = kv->has_value() ? (*kv)->mod_revision : 0;
    absl::StatusOr<proto::RunRecord> run = ReadRun(store, job);
    if (!run.ok()) return run.status();
    absl::StatusOr<std::map<uint32_t, proto::MemberRecord>> members = ReadMembers(store, job);
    if (!members.ok()) return members.status();
    absl::StatusOr<std::optional<KeyValue>> mine = store->Get(keys.Member(shard));
    if (!mine.ok()) return mine.status();
    if (!mine->has_value() || (*mine)->lease != lease) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", shard, "'s member record in etcd is not held by this process's lease"));
    }
    bool others_serve = false;
    for (const auto& [k, m] : *members) {
      if (k != shard && run->generation() != 0 && m.generation() == run->generation()) {
        others_serve = true;
      }
    }
    RunEntry entry;
    proto::RunRecord next = *run;
    const bool entered = std::find(run->entered().begin(), run->entered().end(), shard) !=
                         run->entered().end();
    if (!others_serve) {
      // Nobody serves: whatever ran before stopped as a whole. A new run, from the set
      // this shard finds newest (shared storage) or its own (a volume per shard).
      absl::StatusOr<std::string> set = newest_set ? newest_set() : std::string();
      if (!set.ok()) return set.status();
      next.Clear();
      next.set_generation(run->generation() + 1);
      next.set_restore_set(*set);
      next.add_entered(shard);
      next.set_started_by(absl::StrCat("shard ", shard));
      next.set_started_unix_ms(absl::ToUnixMillis(absl::Now()));
      entry.kind = RunEntry::Kind::kStarted;
    } else if (!entered) {
      next.add_entered(shard);
      entry.kind = RunEntry::Kind::kEntered;
    } else {
      entry.kind = RunEntry::Kind::kRejoin;
      entry.run = *run;
      return entry;
    }
    proto::MemberRecord updated = *member;
    updated.set_generation(next.generation());
    Txn txn;
    txn.conditions.push_back({keys.run, Condition::Field::kModRevision, revision});
    // Still this process's record: a member key held by another lease is not overwritten.
    txn.conditions.push_back(
        {keys.Member(shard), Condition::Field::kModRevision, (*mine)->mod_revision});
    txn.puts.push_back({keys.run, next.SerializeAsString(), kNoLease});
    txn.puts.push_back({keys.Member(shard), updated.SerializeAsString(), lease});
    absl::StatusOr<TxnResult> r = store->Commit(txn);
    if (!r.ok()) return r.status();
    if (r->committed) {
      *member = std::move(updated);
      entry.run = std::move(next);
      return entry;
    }
  }
  return absl::AbortedError(absl::StrCat("the run record at ", keys.run, " changed ", kTries,
                                         " times while shard ", shard, " entered it"));
}

}  // namespace gcomp::coord
