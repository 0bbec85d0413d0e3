// The coordinator's side of a re-shard with coordination.etcd (docs/SERVICE.md,
// "Re-sharding"). Requests only write the job's re-shard record (coord/reshard_record.h):
// gcomp_admin reshard, and every shard's config watcher when its file holds a higher epoch.
// The shard that coordinates drives the record, checking it every `poll`:
//   REQUESTED: runs the re-shard (cluster::RunReshard), writing COMMITTED with the switch
//     step before any shard is told to switch, so the decision outlives this process;
//   COMMITTED, left by a coordinator that stopped half-way: finishes it at that step
//     (cluster::FinishReshard);
// and at the end moves the committed map record to the new map and writes DONE with the
// result's JSON line, or FAILED with the reason.
// Thread-safe. The destructor returns at once: a re-shard in progress runs on in its thread
// and touches neither the state nor the record after (a successor finishes it).
#ifndef GCOMP_SERVER_RESHARD_DRIVER_H_
#define GCOMP_SERVER_RESHARD_DRIVER_H_

#include <functional>
#include <memory>
#include <thread>

#include "absl/time/time.h"
#include "proto/cluster_config.pb.h"
#include "server/cluster_state.h"

namespace gcomp::server {

struct ReshardDriverOptions {
  // How often the record is read while this shard leads.
  absl::Duration poll = absl::Milliseconds(500);
  // Once committed, how long the switch and the moves may take.
  absl::Duration finish_timeout = absl::Minutes(10);
  // Told at every look whether this shard leads and the record holds an unfinished
  // re-shard (for the metric gcomp_shard_reshard_requested).
  std::function<void(bool)> on_pending;
};

class ReshardDriver {
 public:
  // `config`: this shard's own (its security settings reach the other shards).
  ReshardDriver(ClusterState* state, proto::ClusterConfig config, ReshardDriverOptions options);
  ~ReshardDriver();
  ReshardDriver(const ReshardDriver&) = delete;
  ReshardDriver& operator=(const ReshardDriver&) = delete;

 private:
  struct Shared;  // what the thread holds, past this object's end
  std::shared_ptr<Shared> shared_;
  std::thread thread_;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_RESHARD_DRIVER_H_
