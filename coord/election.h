// One coordinator at a time: the holder of a key bound to its lease. The leadership's
// revision (the key's create_revision) is the fencing token of every decision the
// coordinator writes: a transaction conditioned on it fails once the leadership ended,
// even if the deposed coordinator has not noticed yet (paused, partitioned).
// Thread-compatible; the store and lease keeper must outlive it.
#ifndef GCOMP_COORD_ELECTION_H_
#define GCOMP_COORD_ELECTION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coord/lease_keeper.h"
#include "coord/store.h"

namespace gcomp::coord {

struct Leadership {
  std::string key;
  int64_t revision = 0;  // create_revision of the key this leadership wrote
  LeaseId lease = kNoLease;

  // The condition that makes a transaction this leader's decision.
  Condition StillLeader() const {
    return Condition{key, Condition::Field::kCreateRevision, revision};
  }
};

class Election {
 public:
  // `candidate`: this process's name, stored as the key's value (who leads, for operators).
  Election(Store* store, std::string key, std::string candidate, LeaseKeeper* lease)
      : store_(store), key_(std::move(key)), candidate_(std::move(candidate)), lease_(lease) {}

  // One try: leader when the key is free (it is taken) or already ours. nullopt when
  // another candidate leads; FailedPrecondition when this candidate's lease is lost.
  absl::StatusOr<std::optional<Leadership>> TryAcquire();
  // Tries until leader or `deadline` (DeadlineExceeded naming the leader).
  absl::StatusOr<Leadership> Campaign(absl::Time deadline,
                                      absl::Duration poll = absl::Milliseconds(200));
  // Who leads now: the key's value and revision, nullopt when nobody does.
  absl::StatusOr<std::optional<KeyValue>> Leader();
  // Gives the leadership up (deletes the key if it is still this leadership's).
  absl::Status Resign(const Leadership& leadership);

 private:
  Store* const store_;
  const std::string key_;
  const std::string candidate_;
  LeaseKeeper* const lease_;
};

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_ELECTION_H_
