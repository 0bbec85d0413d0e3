// The coordinator of a live re-shard (docs/SERVICE.md, "Re-sharding"): moves a running job
// from the map its shards serve to the one in `next`, without stopping workers. Used by
// `gcomp_admin reshard` and by shard 0 when its config file changes.
//
//   1. Validates `next`, learns the running map from a shard (Resharding.GetConfig) and
//      checks that only `shards` and `shard_map_epoch` change and that the epoch rises.
//   2. Waits (up to `deadline`) for every shard the re-shard adds to answer with the new
//      epoch (they are started with the new config).
//   3. Prepare on every shard of both maps: old shards freeze at their highest started
//      step; any failure aborts them all and the job goes on under the old map.
//   4. Commit of the switch step T (past every started step, at least `at_step`).
//   5. Waits until every shard of the new map serves it and every removed one is drained.
// Thread-compatible; one re-shard at a time per job.
#ifndef GCOMP_CLUSTER_RESHARD_COORDINATOR_H_
#define GCOMP_CLUSTER_RESHARD_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/cluster_config.pb.h"

namespace gcomp::cluster {

struct ReshardOptions {
  // The switch step is at least this (0: the first step no chunk has started).
  int64_t at_step = 0;
  // How long added shards may take to come up, and each Prepare to answer.
  absl::Duration deadline = absl::Seconds(60);
  // How long the switch and the moves may take once committed.
  absl::Duration finish_timeout = absl::Minutes(10);
  // Prepared shards drop the re-shard if no Commit comes within this.
  absl::Duration prepare_timeout = absl::Seconds(30);
  // Called once every Prepare has answered, with the running map and the switch step,
  // before any shard is told to switch: where the decision is made durable (with etcd,
  // the coordinator writes it into the job's re-shard record). An error aborts the
  // re-shard, and nothing changed.
  std::function<absl::Status(const proto::ClusterConfig& from, int64_t switch_step)> before_commit;
};

struct ReshardResult {
  uint64_t from_epoch = 0, to_epoch = 0;
  uint32_t from_shards = 0, to_shards = 0;
  int64_t switch_step = -1;
  uint64_t chunks_moved = 0;  // sent between shards over the network
  uint64_t bytes_moved = 0;   // serialized chunk state sent
  uint64_t chunks_total = 0;  // owned by the new map's shards afterwards
  double pause_ms = 0;        // longest switch-to-serving time of a new-map shard
  std::vector<std::string> removed;  // drained shards: may be stopped now

  // One line: {"from_epoch":..,"to_epoch":..,...,"removed":[..]}.
  std::string ToJson() const;
};

absl::StatusOr<ReshardResult> RunReshard(const proto::ClusterConfig& next,
                                         const ReshardOptions& options);

// Finishes a re-shard from `from` to `next` whose switch step was decided (and recorded)
// before, by a coordinator that stopped half-way: every shard that has not switched is
// committed at `switch_step` (prepared again first if its prepare ran out, which it
// refuses, naming the step, if it started that step under the old map meanwhile), then
// waited for as RunReshard does.
absl::StatusOr<ReshardResult> FinishReshard(const proto::ClusterConfig& from,
                                            const proto::ClusterConfig& next, int64_t switch_step,
                                            const ReshardOptions& options);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_RESHARD_COORDINATOR_H_
