#include "coord/election.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gcomp::coord {

absl::StatusOr<std::optional<Leadership>> Election::TryAcquire() {
  if (!lease_->Valid()) {
    return absl::FailedPreconditionError(
        absl::StrCat(candidate_, " cannot lead: its lease ", lease_->id(), " is lost"));
  }
  Txn txn;
  txn.conditions.push_back({key_, Condition::Field::kCreateRevision, 0});
  txn.puts.push_back({key_, candidate_, lease_->id()});
  absl::StatusOr<TxnResult> r = store_->Commit(txn);
  if (!r.ok()) return r.status();
  absl::StatusOr<std::optional<KeyValue>> held = store_->Get(key_);
  if (!held.ok()) return held.status();
  if (!held->has_value() || (*held)->lease != lease_->id()) return std::optional<Leadership>();
  return std::optional<Leadership>(Leadership{key_, (*held)->create_revision, lease_->id()});
}

absl::StatusOr<Leadership> Election::Campaign(absl::Time deadline, absl::Duration poll) {
  while (true) {
    absl::StatusOr<std::optional<Leadership>> won = TryAcquire();
    if (!won.ok() && !absl::IsUnavailable(won.status()) &&
        !absl::IsDeadlineExceeded(won.status())) {
      return won.status();
    }
    if (won.ok() && won->has_value()) return **won;
    if (absl::Now() + poll > deadline) {
      absl::StatusOr<std::optional<KeyValue>> leader = Leader();
      const std::string who = leader.ok() && leader->has_value() ? (*leader)->value : "nobody";
      return absl::DeadlineExceededError(
          absl::StrCat(candidate_, " did not become the leader of ", key_, " in time; ", who,
                       " leads", won.ok() ? "" : absl::StrCat(" (", won.status().message(), ")")));
    }
    absl::SleepFor(poll);
  }
}

absl::StatusOr<std::optional<KeyValue>> Election::Leader() { return store_->Get(key_); }

absl::Status Election::Resign(const Leadership& leadership) {
  Txn txn;
  txn.conditions.push_back(leadership.StillLeader());
  txn.deletes.push_back(key_);
  absl::StatusOr<TxnResult> r = store_->Commit(txn);
  return r.status();
}

}  // namespace gcomp::coord
