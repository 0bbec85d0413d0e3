// A shard's place in the cluster's state kept in etcd (config `coordination.etcd`;
// docs/SERVICE.md, "Cluster state in etcd"): its lease and member record, the coordinator's
// election, and the committed shard-map record. One class with one lock, beside
// ShardService, which asks it three things:
//   - may I acknowledge? (CheckLease: a shard whose lease is not provably alive, paused or
//     cut off from etcd, answers nothing, since its chunks may already be served elsewhere);
//   - is shard k alive? (IsLive: its member record exists, i.e. its lease does; this, not a
//     peer's probe, is what a failover counts);
//   - may this map change? (CommitMap: a compare-and-swap of the record, conditioned on this
//     shard still leading: of two coordinators only one can write epoch N+1).
// and tells it two: a newer committed map (on_map), and a member whose lease ended while
// this shard coordinates (on_member_lost). Thread-safe.
#ifndef GCOMP_SERVER_CLUSTER_STATE_H_
#define GCOMP_SERVER_CLUSTER_STATE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coord/election.h"
#include "coord/job_run.h"
#include "coord/lease_keeper.h"
#include "coord/map_record.h"
#include "coord/reshard_record.h"
#include "coord/store.h"
#include "proto/cluster_config.pb.h"
#include "proto/coord.pb.h"

namespace gcomp::server {

struct ClusterStateOptions {
  uint32_t shard = 0;
  // Called with every committed map whose epoch is above the last one passed here (from
  // the state's own thread; it may call back into ClusterState).
  std::function<void(const proto::ShardMapRecord&)> on_map;
  // Called, while this shard coordinates, with a shard of the map that holds no lease:
  // one whose lease ended, or that has not registered for 2 lease TTLs (from the state's
  // own thread).
  std::function<void(uint32_t shard, const std::string& why)> on_member_lost;
  // Period of the election and member checks; 0: a third of the lease TTL.
  absl::Duration tick = absl::ZeroDuration();
};

class ClusterState {
 public:
  // Connects to `config.coordination.etcd` (or uses `store`, e.g. a MemoryStore in tests),
  // takes a lease, registers as shard `options.shard` (AlreadyExists naming the holder when
  // a live process already registered it: two processes started as one shard), writes the
  // job's first map record from the config unless one exists, and starts watching.
  // Unavailable when no etcd member answers.
  static absl::StatusOr<std::unique_ptr<ClusterState>> Join(
      const proto::ClusterConfig& config, ClusterStateOptions options,
      std::shared_ptr<coord::Store> store = nullptr);
  // Stops, gives up the coordinator's key if held, and revokes the lease (the member
  // record goes with it).
  ~ClusterState();
  ClusterState(const ClusterState&) = delete;
  ClusterState& operator=(const ClusterState&) = delete;

  // OK while this shard's lease is provably alive and the shard was not taken out of the
  // map meanwhile; Unavailable naming why otherwise.
  absl::Status CheckLease() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether shard `k` holds a lease now (as last seen from etcd).
  bool IsLive(uint32_t k) const ABSL_LOCKS_EXCLUDED(mu_);
  // The coordinator's shard index, nullopt when none leads.
  std::optional<uint32_t> Leader() const ABSL_LOCKS_EXCLUDED(mu_);
  // Whether this shard is the coordinator as of its last election tick (no etcd call; a
  // decision is checked against etcd when it is committed).
  bool Leading() const ABSL_LOCKS_EXCLUDED(mu_);
  // Tries to lead: true when this shard is the coordinator now.
  absl::StatusOr<bool> Lead() ABSL_LOCKS_EXCLUDED(mu_);
  // The coordinator's decision: the committed map moves from `from` to `next` (a higher
  // shard_map_epoch with its down and joining shards) if the record still holds `from`'s
  // epoch or an older one and this shard still leads. Aborted (nothing written) otherwise:
  // another coordinator decided first, or this one lost its lease.
  absl::Status CommitMap(const proto::ClusterConfig& from, const proto::ClusterConfig& next)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The job's re-shard record (coord/reshard_record.h): read it; ask for a re-shard (any
  // shard, e.g. its config watcher); and the coordinator's write, Aborted unless this shard
  // leads, still does when the write lands, and the record is still at base.revision.
  absl::StatusOr<std::optional<coord::VersionedReshard>> ReadReshard() ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<coord::VersionedReshard> RequestReshard(proto::ReshardRecord request)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<coord::VersionedReshard> UpdateReshard(const coord::VersionedReshard& base,
                                                        proto::ReshardRecord next)
      ABSL_LOCKS_EXCLUDED(mu_);
  // How this shard enters the job (coord/job_run.h): the run's start, entering a run being
  // started (both: restore the run's restore_set), or a rejoin. `newest_set` is asked only
  // when this shard starts a run.
  absl::StatusOr<coord::RunEntry> EnterRun(
      const std::function<absl::StatusOr<std::string>()>& newest_set) ABSL_LOCKS_EXCLUDED(mu_);
  // A shard that rejoined is taken back: it serves in run `generation` from now on (so a
  // later restart of its peers counts it as a running job).
  absl::Status MarkServing(uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);
  // The record as last seen, with its revision (status, tests).
  coord::VersionedMap map() const ABSL_LOCKS_EXCLUDED(mu_);
  coord::LeaseId lease() const ABSL_LOCKS_EXCLUDED(mu_);

  // The record a config's map makes (epoch, shards, replicas, down and joining shards).
  static proto::ShardMapRecord RecordOf(const proto::ClusterConfig& map, const std::string& by);

  // With coordination.etcd the job's shard list in etcd wins over the file's, so that a
  // scale (gcomp_admin scale) needs no edit of the file that every pod reads:
  //   - a shard that a re-shard under way adds (its index is in the requested map, not in
  //     the committed one) starts with the requested map, empty, as an added shard does;
  //   - a shard started while its file lists other shards than the committed map of a
  //     higher epoch (a pod restarted after a scale) takes the committed shard list at the
  //     file's epoch, then installs the committed map as any restarted shard does.
  // `config` unchanged otherwise (no etcd, no record yet, or the file already agrees);
  // FailedPrecondition when `shard` is in none of them. `store`: the config's etcd if null.
  static absl::StatusOr<proto::ClusterConfig> WithJobMap(const proto::ClusterConfig& config,
                                                         uint32_t shard,
                                                         coord::Store* store = nullptr);

 private:
  ClusterState(const proto::ClusterConfig& config, ClusterStateOptions options,
               std::shared_ptr<coord::Store> store);
  absl::Status Register() ABSL_LOCKS_EXCLUDED(mu_);
  // This shard's leadership for a decision: taken now if free; Aborted naming the leader
  // when another shard leads, or when this shard's lease is not valid.
  absl::StatusOr<coord::Leadership> DecidingLeadership() ABSL_LOCKS_EXCLUDED(mu_);
  // Reads every key of the job and (re)starts the watch after that revision.
  absl::Status Resync() ABSL_LOCKS_EXCLUDED(mu_);
  void OnEvent(const coord::WatchEvent& e) ABSL_LOCKS_EXCLUDED(mu_);
  // Elections, lost members, a lost lease's return, a broken watch: every tick.
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  void Tick() ABSL_LOCKS_EXCLUDED(mu_);
  // Passes a newer map to on_map (outside mu_).
  void OfferMap(const coord::VersionedMap& m) ABSL_LOCKS_EXCLUDED(mu_);

  const proto::ClusterConfig config_;
  const ClusterStateOptions options_;
  const coord::JobKeys keys_;
  const std::string name_;  // "shard K"
  const uint64_t incarnation_;
  const std::shared_ptr<coord::Store> store_;
  const absl::Duration tick_;

  mutable absl::Mutex mu_;
  // Shared so that etcd calls run outside mu_ (CheckLease, on every push, never waits for
  // the network); replaced together when the lease is taken again.
  std::shared_ptr<coord::LeaseKeeper> lease_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<coord::Election> election_ ABSL_GUARDED_BY(mu_);
  std::optional<coord::Leadership> leadership_ ABSL_GUARDED_BY(mu_);
  // This process's member record as last written (registered again as it is when the
  // lease is taken anew, its run included).
  proto::MemberRecord member_ ABSL_GUARDED_BY(mu_);
  coord::VersionedMap map_ ABSL_GUARDED_BY(mu_);
  uint64_t offered_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint32_t, proto::MemberRecord> members_ ABSL_GUARDED_BY(mu_);
  // Since when each shard of the map has had no member record, as this process saw it.
  std::map<uint32_t, absl::Time> absent_since_ ABSL_GUARDED_BY(mu_);
  std::optional<uint32_t> leader_ ABSL_GUARDED_BY(mu_);
  bool watch_broken_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<coord::Watch> watch_;  // only Resync and the destructor touch it
  std::thread loop_;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_CLUSTER_STATE_H_
