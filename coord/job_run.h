// A job's runs (/gcomp/<job>/run, RunRecord): how a starting shard enters its job.
//
// A whole-job restart (every shard stopped, then started again, e.g. from checkpoints)
// and one shard's restart into a running job look alike from inside a shard: both find
// peers with tensors. Told apart here, from etcd only:
//   - no other shard serves in the current run (no live member record carries its
//     generation): the job is not running. This shard starts the next run and names the
//     checkpoint set that every shard of it restores;
//   - the run goes on and this shard has not entered it yet: it is part of the run's start
//     (it restores the run's set and serves);
//   - the run goes on and this shard entered it before: it restarted into the running job
//     and rejoins (its state comes from the other copies, not from a checkpoint).
// Each decision that writes is one transaction conditioned on the run record's revision,
// with this shard's member record (its generation) in it: two shards starting at once
// cannot both start a run.
#ifndef GCOMP_COORD_JOB_RUN_H_
#define GCOMP_COORD_JOB_RUN_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "coord/store.h"
#include "proto/coord.pb.h"

namespace gcomp::coord {

struct RunEntry {
  enum class Kind {
    kStarted,  // this shard started the run
    kEntered,  // entered a run another shard started, before it served
    kRejoin,   // restarted into the running run: rejoin, restore nothing
  };
  Kind kind = Kind::kStarted;
  proto::RunRecord run;  // the run in force (for kRejoin: the one to rejoin)
};

const char* RunEntryKindName(RunEntry::Kind kind);

// The job's current run; a record with generation 0 when none was written. DataLoss naming
// the key when it does not parse.
absl::StatusOr<proto::RunRecord> ReadRun(Store* store, const std::string& job);

// Enters shard `shard` (registered already: its member record is held under `lease`) into
// the job's run as above. `member` is its member record: on kStarted and kEntered its
// generation is set and written with the run. `newest_set` is asked only when this shard
// starts a run: the checkpoint set to restore ("" for none). Aborted when other shards kept
// changing the run for longer than a few tries.
absl::StatusOr<RunEntry> EnterRun(Store* store, const std::string& job, uint32_t shard,
                                  proto::MemberRecord* member, LeaseId lease,
                                  const std::function<absl::StatusOr<std::string>()>& newest_set);

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_JOB_RUN_H_
