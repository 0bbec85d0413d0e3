// `gcomp_admin status` with `coordination.etcd`: what etcd holds for the job, the one
// source of truth for who is in the map: the committed map record, the live members with
// their leases and runs, the coordinator, and the job's current run.
#ifndef GCOMP_ADMIN_COORDINATION_H_
#define GCOMP_ADMIN_COORDINATION_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coord/reshard_record.h"
#include "coord/store.h"
#include "proto/cluster_config.pb.h"
#include "proto/coord.pb.h"

namespace gcomp::admin {

struct CoordinationStatus {
  std::optional<proto::ShardMapRecord> map;  // nullopt: no map written yet (job not started)
  int64_t map_revision = 0;
  struct Member {
    proto::MemberRecord record;
    coord::LeaseId lease = coord::kNoLease;
  };
  std::map<uint32_t, Member> members;  // shards holding a lease, by index
  std::string coordinator;             // "" when none leads
  proto::RunRecord run;                // generation 0: no run started yet
  std::optional<proto::ReshardRecord> reshard;  // the latest re-shard; nullopt: none yet

  // Every shard of the map that is not down holds a lease (the map and the leases agree).
  bool healthy() const;
};

// Reads the job's keys from `store`. Unavailable when no etcd member answers, DataLoss
// naming the key when a record does not parse.
absl::StatusOr<CoordinationStatus> CollectCoordination(coord::Store* store,
                                                       const std::string& job);
// The same from the config's coordination.etcd; FailedPrecondition when it lists none.
absl::StatusOr<CoordinationStatus> CollectCoordination(const proto::ClusterConfig& config);

// `gcomp_admin reshard` with coordination.etcd: asks the job's coordinator for the re-shard
// to `next` (writes the request into the job's re-shard record; coord/reshard_record.h) and
// waits up to `wait` for its end. The re-shard's JSON line when DONE; FailedPrecondition
// with the coordinator's reason when FAILED; DeadlineExceeded naming the phase it is in
// (the coordinator goes on with it); FailedPrecondition naming another re-shard under way.
absl::StatusOr<std::string> AskForReshard(coord::Store* store, const proto::ClusterConfig& next,
                                          int64_t at_step, absl::Duration deadline,
                                          absl::Duration wait);
// Its two halves: the request (the record as written, or as another asker left it for the
// same epoch), and the wait for the end of the re-shard to `epoch`.
absl::StatusOr<coord::VersionedReshard> RequestReshardTo(coord::Store* store,
                                                         const proto::ClusterConfig& next,
                                                         int64_t at_step, absl::Duration deadline);
absl::StatusOr<std::string> AwaitReshard(coord::Store* store, const std::string& job,
                                         uint64_t epoch, absl::Duration wait);

// Lines under the shard table:
//   etcd: map epoch 3 (revision 41, written by shard 0), down [1], joining []
//   coordinator: shard 0
//   leases: shard 0 (127.0.0.1:7000, lease 7587..., run 2), shard 2 (...); none: shard 1
//   run: 2, started by shard 2, restores final-of-3, entered [2, 0, 1]
//   re-shard: to epoch 4 (4 shards), DONE at step 14, asked for by gcomp_admin, decided by shard 0
std::string FormatCoordinationText(const CoordinationStatus& status);
// One JSON object: {"map":{...}|null,"revision":N,"coordinator":"...","members":[...],
// "healthy":bool,"run":{...}|null,"reshard":{...}|null}.
std::string FormatCoordinationJson(const CoordinationStatus& status);

}  // namespace gcomp::admin

#endif  // GCOMP_ADMIN_COORDINATION_H_
