// The committed shard map and the members of one job, as records in the store:
//   /gcomp/<job>/map            ShardMapRecord, changed only by compare-and-swap
//   /gcomp/<job>/members/<k>    MemberRecord of live shard k, bound to its lease
//   /gcomp/<job>/coordinator    the coordinator's name, bound to its lease (election.h)
//   /gcomp/<job>/run            RunRecord: the job's current run (job_run.h)
//   /gcomp/<job>/reshard        ReshardRecord: the latest re-shard (reshard_record.h)
// The map's mod_revision is the fencing token of a decision: every call that moves state
// carries the revision it was decided under, and a receiver that knows a newer one refuses.
#ifndef GCOMP_COORD_MAP_RECORD_H_
#define GCOMP_COORD_MAP_RECORD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "coord/election.h"
#include "coord/store.h"
#include "proto/coord.pb.h"

namespace gcomp::coord {

struct JobKeys {
  explicit JobKeys(const std::string& job);
  std::string prefix;  // /gcomp/<job>/
  std::string map;
  std::string members;  // prefix of the member keys
  std::string coordinator;
  std::string run;
  std::string reshard;
  std::string Member(uint32_t shard) const;
};

struct VersionedMap {
  proto::ShardMapRecord record;
  int64_t revision = 0;  // the map key's mod_revision
};

// InvalidArgument naming the field when the record is not a usable map: no shards, an empty
// or repeated address, epoch 0, replicas past the shard count, a down or joining index out
// of range or in both lists, every shard down.
absl::Status ValidateMap(const proto::ShardMapRecord& record);

// The job's map; nullopt when none was written. DataLoss naming the key when it does not
// parse.
absl::StatusOr<std::optional<VersionedMap>> ReadMap(Store* store, const std::string& job);

// Writes `record` as the job's first map unless one exists; the map in force either way.
absl::StatusOr<VersionedMap> CreateMapIfAbsent(Store* store, const std::string& job,
                                               const proto::ShardMapRecord& record);

// Replaces the map read as `base` by `next`, atomically: only if the map is still at
// base.revision and, when `leader` is given, that leadership still holds. `next.epoch` must
// be above base's. Aborted (nothing written) when either changed: read again and decide
// again.
absl::StatusOr<VersionedMap> UpdateMap(Store* store, const std::string& job,
                                       const VersionedMap& base, proto::ShardMapRecord next,
                                       const Leadership* leader);

// The live members by shard index (their keys exist, so their leases do).
absl::StatusOr<std::map<uint32_t, proto::MemberRecord>> ReadMembers(Store* store,
                                                                    const std::string& job);

// Registers shard `shard` as live under `lease`. AlreadyExists naming the holder when
// another live process registered that index (two processes started as one shard).
absl::Status RegisterMember(Store* store, const std::string& job, uint32_t shard,
                            const proto::MemberRecord& member, LeaseId lease);

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_MAP_RECORD_H_
