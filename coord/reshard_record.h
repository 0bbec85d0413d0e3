// The job's re-shard as a record in the store (/gcomp/<job>/reshard, proto ReshardRecord):
// a request (gcomp_admin reshard, a shard whose config file now holds a higher epoch) only
// writes REQUESTED; the coordinator takes it up, writes COMMITTED with the switch step
// before any shard is told to switch, and DONE or FAILED at the end. A coordinator elected
// mid-way finds the decision here and finishes it (docs/SERVICE.md, "Re-sharding").
#ifndef GCOMP_COORD_RESHARD_RECORD_H_
#define GCOMP_COORD_RESHARD_RECORD_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coord/election.h"
#include "coord/store.h"
#include "proto/coord.pb.h"

namespace gcomp::coord {

struct VersionedReshard {
  proto::ReshardRecord record;
  int64_t revision = 0;  // the key's mod_revision
};

// DONE or FAILED: nothing more happens to it.
bool Finished(const proto::ReshardRecord& record);

// "REQUESTED", "COMMITTED", ...
const std::string& PhaseName(proto::ReshardRecord::Phase phase);

// The job's re-shard record; nullopt when none was ever asked for. DataLoss naming the key
// when it does not parse or has no phase.
absl::StatusOr<std::optional<VersionedReshard>> ReadReshard(Store* store, const std::string& job);

// Asks for the re-shard `request` describes (phase REQUESTED, `next` set). Asking again
// for the epoch the record already holds, unless that one FAILED, is the same request: the
// record is returned as it is. FailedPrecondition naming the epoch when another re-shard is
// requested or committed and not finished; InvalidArgument when `request` is not a request.
absl::StatusOr<VersionedReshard> RequestReshard(Store* store, const std::string& job,
                                                proto::ReshardRecord request);

// The coordinator's write: `base` becomes `next` only if the record is still at
// base.revision and `leader` still leads. Aborted (nothing written) otherwise.
absl::StatusOr<VersionedReshard> UpdateReshard(Store* store, const std::string& job,
                                               const VersionedReshard& base,
                                               proto::ReshardRecord next, const Leadership& leader);

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_RESHARD_RECORD_H_
