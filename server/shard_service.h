// The logic of one shard, behind the gRPC adapter (grpc_service.h) and testable without a
// network: worker registry, declared tensors with their owned chunks, and validated
// push-pull into per-chunk StepAccumulators. Thread-safe.
//
// Every rejected request leaves shard state unchanged. Status codes (docs/SERVICE.md):
//   NotFound            unknown job or key
//   FailedPrecondition  wrong shard-map epoch, chunk owned by another shard, stale or
//                       future step
//   InvalidArgument     bad worker id, step, dtype, element count, codec fields
//   ResourceExhausted   block larger than the codec's bound for its size; a limit of
//                       config `limits` (memory budget, tensors, pending steps/bytes)
//   DataLoss            checksum mismatch or corrupt codec block
//   DeadlineExceeded    the step timed out; the message names the missing workers
//   AlreadyExists       a tensor re-declared with a different dtype, size or optimizer
//   Unavailable         the shard is shutting down, or filling after a re-shard (retry)
//   Aborted             the shard-map epoch of the call was replaced by a re-shard: fetch
//                       the new config (CurrentConfig) and resend under it
#ifndef GCOMP_SERVER_SHARD_SERVICE_H_
#define GCOMP_SERVER_SHARD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/thread_pool.h"
#include "cluster/cluster_config.h"
#include "cluster/shard_map.h"
#include "cluster/wire_block.h"
#include "proto/aggregation.pb.h"
#include "proto/cluster_config.pb.h"
#include "proto/reshard.pb.h"
#include "proto/coord.pb.h"
#include "server/admission.h"
#include "server/checkpoint.h"
#include "server/cluster_state.h"
#include "server/shard_metrics.h"
#include "server/step_accumulator.h"

namespace gcomp::server {

// Calls on peer shards (the gRPC server sets them; tests may call peers directly).
struct ShardPeers {
  // Sends one message of moved chunk state to the shard at `address` (a re-shard's
  // Transfer). Unset: a re-shard that must move chunks to another shard fails its
  // transfer (logged).
  std::function<absl::Status(const std::string& address, const proto::TransferRequest&)>
      send_transfer;
  // Replication and failover (config `replicas` >= 2): one part of a chunk's state to a
  // backup; a down report to the coordinator; a new map to a peer; whether a peer answers
  // within `timeout`. Unset: replication fails (a chunk with backups never answers) and
  // no failover runs.
  std::function<absl::Status(const std::string& address, const proto::ReplicateRequest&)>
      send_replica;
  std::function<absl::Status(const std::string& address, const proto::ReportDownRequest&,
                             proto::ReportDownResponse*)>
      report_down;
  std::function<absl::Status(const std::string& address, const proto::InstallMapRequest&)>
      install_map;
  std::function<absl::Status(const std::string& address, absl::Duration timeout)> probe;
  // A restarted shard: where a peer stands (is a job running?), and its request to be
  // taken back.
  std::function<absl::StatusOr<proto::ReshardStatusResponse>(const std::string& address,
                                                             absl::Duration timeout)>
      status;
  std::function<absl::Status(const std::string& address, const proto::RejoinRequest&,
                             proto::RejoinResponse*)>
      rejoin;
};

// More decode threads than this only add stacks (each pushed block is one task).
inline constexpr int kMaxDecodeThreads = 256;

struct ShardOptions {
  uint32_t shard = 0;
  // Threads that decode and convert pushed blocks: 1 to kMaxDecodeThreads.
  int decode_threads = 4;
  ShardPeers peers;
  // Calls that may wait at once for this shard to reach a shard-map epoch (calls of a
  // re-shard's new map before the switch, transfers, a failover's map): past it such a call
  // is refused as busy (ResourceExhausted, retried by clients), so that calls of a prepared
  // epoch cannot hold every request thread. gcomp_server gives half its request threads.
  uint32_t max_waiting_for_epoch = 128;
  // The cluster's state in etcd (config `coordination.etcd`), or null (the peer protocol
  // alone). Borrowed: it must outlive the service's calls. With it, a shard whose lease is
  // not provably alive acknowledges nothing, failovers count a shard down when its lease
  // ended (not when a probe went unanswered), and every map a coordinator installs is
  // first committed in etcd by compare-and-swap.
  ClusterState* cluster_state = nullptr;
};

class ShardService {
 public:
  // The memory budget a shard uses under `limits`: memory_budget_bytes, or when 0, 80% of
  // the memory available to the process (cgroup limit or physical memory); the rest is
  // headroom for gRPC buffers, transient decode buffers and thread stacks.
  static uint64_t MemoryBudgetBytes(const proto::LimitsConfig& limits);

  // InvalidArgument if the config is invalid or the shard index is out of range. With
  // `checkpoint.dir` set, first restores the newest complete checkpoint there (the chunks
  // this shard owns under its config; docs/CHECKPOINT.md): FailedPrecondition when it is of
  // another job or chunk size, DataLoss when checkpoints exist but none is intact; nothing
  // is half-loaded.
  static absl::StatusOr<std::unique_ptr<ShardService>> Create(const proto::ClusterConfig& config,
                                                              const ShardOptions& options);
  ~ShardService();
  ShardService(const ShardService&) = delete;
  ShardService& operator=(const ShardService&) = delete;

  // `deadline` bounds only the wait of a call of the new map during a re-shard.
  absl::Status RegisterWorker(const proto::RegisterWorkerRequest& request,
                              proto::RegisterWorkerResponse* response,
                              absl::Time deadline = absl::Now() + absl::Seconds(10));
  absl::Status DeclareTensor(const proto::DeclareTensorRequest& request,
                             proto::DeclareTensorResponse* response,
                             absl::Time deadline = absl::Now() + absl::Seconds(10));
  // Waits until the step completes or fails, or `deadline` passes.
  absl::Status PushPull(const proto::CompressedBlock& request, absl::Time deadline,
                        proto::CompressedBlock* response);
  // The same, as the gRPC data path calls it: the block's fields in `header` (its `data`
  // ignored), its payload in `data` (the pieces it arrived in), and the step's result in
  // *reply, shared by every worker of the step (answer with its payload and the caller's
  // worker id).
  absl::Status PushPull(const proto::CompressedBlock& header, cluster::WirePieces data,
                        absl::Time deadline, std::shared_ptr<const proto::CompressedBlock>* reply);
  // The same without a thread waiting for the step: `done` gets the status and reply
  // once, on a pool thread. `header` and `data` must stay valid until then.
  using PushDone = absl::AnyInvocable<void(absl::Status,
                                           std::shared_ptr<const proto::CompressedBlock>) &&>;
  void PushPullAsync(const proto::CompressedBlock& header, cluster::WirePieces data,
                     absl::Time deadline, PushDone done);
  absl::Status Pull(const proto::PullRequest& request, proto::CompressedBlock* response,
                    absl::Time deadline = absl::Now() + absl::Seconds(10));
  void Stats(proto::StatsResponse* response) const;

  // Ends every wait and refuses later calls with Unavailable.
  void Shutdown();

  // Live re-sharding (docs/SERVICE.md, "Re-sharding"), driven by a coordinator over the
  // Resharding service. Prepare freezes the old map (old-map pushes of steps past the
  // highest one started here wait) or, on a shard only in the new map, arms the wait for
  // the moved state; InvalidArgument for a config that is no valid successor. Commit fixes
  // the switch step T: old-map pushes of step >= T get Aborted; once every chunk here has
  // completed T - 1 (or after step_timeout_ms: pushes of an unfinished step are resent),
  // the shard switches to the new map, sends the chunks it loses to their new owners and,
  // when every old shard's share has arrived, serves the new map. Abort (before Commit)
  // drops the prepared re-shard, as does a Commit that does not come within the prepare
  // timeout.
  absl::StatusOr<proto::PrepareReshardResponse> PrepareReshard(
      const proto::PrepareReshardRequest& request);
  absl::Status CommitReshard(uint64_t next_epoch, int64_t switch_step);
  absl::Status AbortReshard(uint64_t next_epoch, const std::string& reason);
  // One message of moved state from an old shard; waits (until `deadline`) for this shard
  // to switch. FailedPrecondition when no re-shard to that epoch is under way.
  absl::Status AcceptTransfer(const proto::TransferRequest& request, absl::Time deadline);
  // The config of the map this shard serves, or the committed next one.
  proto::ClusterConfig CurrentConfig() const;

  // Replication and failover (docs/SERVICE.md, "Replication and failover").
  // One part of a chunk's state from its owner; this shard must be one of the chunk's
  // backups under the sender's map. Aborted when the sender's map was replaced here,
  // Unavailable when this shard has not installed it yet.
  absl::Status AcceptReplica(const proto::ReplicateRequest& request);
  // Someone could not reach a shard: on the coordinator (the lowest live shard that
  // answers; others forward to it), probes every live shard and installs a map without
  // the ones that do not answer. The response names the map after it.
  absl::Status ReportDown(const proto::ReportDownRequest& request,
                          proto::ReportDownResponse* response);
  // The coordinator's map: same shards, a higher epoch, other down_shards or
  // joining_shards. Backups of a down owner's chunks promote their replicated state; a
  // chunk whose every copy is down is lost, and its calls get DataLoss naming the shards.
  // A joining shard declares the request's tensors and backs its chunks up; when it is no
  // longer joining, it takes them over from their backups.
  absl::Status InstallMap(const proto::InstallMapRequest& request);
  // On the coordinator: a restarted shard asks to be taken back (docs/SERVICE.md).
  absl::Status Rejoin(const proto::RejoinRequest& request, proto::RejoinResponse* response);
  // With replicas >= 2, a shard that starts while its peers run a job restarted after a
  // crash: its memory is empty, so it must not serve before it has caught up. Hold (before
  // the server listens) refuses every call with Unavailable; Start (once it listens) asks
  // the peers and, if a job is running, rejoins it in the background.
  void HoldForRejoinCheck();
  void StartRejoinCheck();
  void ReshardStatus(proto::ReshardStatusResponse* response) const;
  // Whether this shard serves training calls now (its readiness): OK, or why not: shutting
  // down, rejoining the running job (restarted, or taken out while alive), drained (a
  // re-shard removed it, or a failover took it out without etcd), or, with etcd, no lease
  // it can prove alive.
  absl::Status Ready() const;
  // From ClusterState: a map committed in etcd by the coordinator, installed here unless
  // this shard has it already (or is rejoining: its coordinator's install carries the
  // declarations it needs); and, on the coordinator, a shard whose lease ended.
  void OnCommittedMap(const proto::ShardMapRecord& record);
  void OnMemberLost(uint32_t shard, const std::string& why);

  // Writes the checkpoint set "final" (every chunk at its last completed step) into
  // `checkpoint.dir`; call after Shutdown (SIGTERM). FailedPrecondition without a dir.
  absl::Status WriteFinalCheckpoint();
  // Waits until the periodic checkpoints queued so far are written (tests, shutdown).
  void FlushCheckpoints();
  // What the start-up restore loaded: the set's directory and step ("" / -1 if none).
  const std::string& restored_from() const { return restored_from_; }
  int64_t restored_step() const { return restored_step_; }

  // This shard's index in the map it serves (changes with a re-shard).
  uint32_t shard() const { return shard_index_.load(); }
  AdmissionUsage admission_usage() const { return admission_->usage(); }
  // The shard's Prometheus metrics (served on /metrics by gcomp_server).
  ShardMetrics* metrics() const { return metrics_.get(); }
  const proto::ClusterConfig& config() const { return config_; }

 private:
  struct Tensor;
  struct TensorBackup;

  // Re-sharding's phases; a shard that has never been re-sharded is kServing.
  enum class Phase { kServing, kPrepared, kCommitted, kFilling, kDrained };

  // Snapshots of one step boundary, gathered chunk by chunk until every owned chunk is in.
  struct PendingCheckpoint {
    uint32_t shard = 0, shards = 1;  // the map the step ran under
    uint64_t epoch = 1;
    std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> chunks;
    uint64_t reserved_bytes = 0;
    bool refused = false;  // a snapshot did not fit the memory budget: the step is skipped
    // The next boundary came first: the owned chunks still missing completed no step
    // since (declared but not pushed, or no longer pushed), so their state now is their
    // state at this boundary; the writer adds it.
    bool fill = false;
    // tensors_declared_ when the set began: a tensor declared after that (here, and maybe
    // not on a shard that wrote the set before) would make the set unrestorable.
    uint64_t declared = 0;
  };

  ShardService(proto::ClusterConfig config, const ShardOptions& options);
  // Chunk states of a checkpoint set, decoded and checked while it was chosen.
  using CheckedStates = absl::flat_hash_map<std::pair<std::string, uint32_t>, ChunkSnapshot>;
  // FailedPrecondition, with the command that moves them, when this job's sets are still
  // in checkpoint.dir itself (the layout before checkpoint.dir/JOB) and none in its own.
  absl::Status RefuseSetsOutsideTheJobDir() const;
  // Restores the newest restorable set of this job's checkpoint directory (none: starts
  // empty).
  absl::Status RestoreFromCheckpoint();
  // The newest set of this job's checkpoint directory that this shard can restore, or with `only_set`, that
  // set (FailedPrecondition naming it when it cannot be restored); its states this shard
  // owns go into *checked.
  absl::StatusOr<LoadedCheckpoint> LoadForRestore(const std::string& only_set,
                                                  CheckedStates* checked);
  absl::Status RestoreLoaded(LoadedCheckpoint loaded, CheckedStates checked);
  // How this shard enters the job (with coordination.etcd: the run record decides, see
  // coord/job_run.h; without: it restores checkpoint.dir's newest set, if any).
  absl::Status EnterJob();
  // With etcd: enters the job's run (coord/job_run.h) and, unless it rejoins, restores the
  // set the run names. Also what EnterNextRun does.
  absl::StatusOr<coord::RunEntry> EnterRunAndRestore();
  // With etcd, a rejoining shard whose run ended (every serving shard stopped): it enters
  // the next run instead, restoring its set. True when it did (or failed to restore it).
  bool EnterNextRun();
  // Called by a chunk's accumulator (under its lock) at a checkpoint step boundary.
  void OnSnapshot(const std::string& key, uint32_t chunk, ChunkSnapshot snapshot);
  void CheckpointLoop();
  // Once pending steps fill half of limits.max_pending_steps, fails the steps that timed
  // out with nobody left waiting (a client that pushed one chunk each of many tensors and
  // left): a push to the same chunk would reap them, but none may come, and their slots
  // would refuse honest steps for good. Checks once a second until expiry_stop_.
  void ExpiryLoop() ABSL_LOCKS_EXCLUDED(mu_, expiry_mu_);
  // Every chunk's accumulator held here (a copy of the list: used outside mu_).
  std::vector<std::shared_ptr<StepAccumulator>> Accumulators() const ABSL_LOCKS_EXCLUDED(mu_);
  // Fails every pending step that `worker` pushed to (StepAccumulator::DropPendingOf): a
  // new process registered with its index.
  void DropPendingPushesOf(uint32_t worker) ABSL_LOCKS_EXCLUDED(mu_);
  void ExpireTimedOutSteps() ABSL_LOCKS_EXCLUDED(mu_);
  // Adds the current snapshots of the owned chunks missing from a `fill` set; false (the set
  // is skipped, logged) when the map changed since or they do not fit the memory budget.
  bool FillCheckpoint(int64_t step, PendingCheckpoint* p) ABSL_LOCKS_EXCLUDED(mu_, ckpt_mu_);
  // Encodes and writes one shard file of the set (final or the periodic one of `step`).
  // `declared`: for a periodic set, tensors_declared_ when it began (see PendingCheckpoint).
  absl::Status WriteCheckpoint(
      bool final, int64_t step, uint32_t shard, uint32_t shards, uint64_t epoch, uint64_t declared,
      std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> chunks);
  // NotFound "unknown job" unless `job` is this shard's. `name_ours`: the message also
  // names the job served here (for workers, whose config may point at the wrong cluster;
  // peers run from the same config).
  absl::Status CheckJob(const std::string& job, bool name_ours) const;
  // A worker's call: NotFound for another job, FailedPrecondition for another shard-map
  // epoch, Aborted for one a re-shard or failover replaced. A call of the new map while the
  // shard is still switching or filling waits for it (until `deadline`; then Unavailable,
  // which clients retry), as does one of a failover's map not installed here yet (briefly).
  absl::Status CheckJobAndEpoch(const std::string& job, uint64_t epoch,
                                absl::Time deadline = absl::Now() + absl::Seconds(10)) const;
  absl::Status CheckEpochLocked(uint64_t epoch, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A peer's message under `epoch`, in any phase: Aborted when a newer map is installed
  // here, Unavailable when `epoch` is not installed yet. Never waits (the sender is
  // answering a step).
  absl::Status CheckPeerEpochLocked(uint64_t epoch) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The accumulator of one owned chunk, with its step reply, data and checkpoint hooks.
  std::shared_ptr<StepAccumulator> MakeAccumulator(const Tensor& t, uint32_t chunk);
  // Declares `r` (already checked) unless already declared; the tensor.
  // `fresh`: declared by a worker, so no step of it ran anywhere before (this shard's
  // backups of it hold the acknowledged state); not for moved or restored tensors.
  // `placement`, when given and still of the current map, is the tensor's chunk placement
  // computed beforehand without the lock (PlaceUnlocked).
  struct Placement {
    cluster::ShardMap map;
    std::vector<bool> down, joining;
    uint32_t self = 0;
    std::vector<uint32_t> live;  // map.LiveReplicas of the tensor
    uint64_t reserved_bytes = 0;  // in the admission budget, for `live`
  };
  absl::StatusOr<Tensor*> DeclareLocked(const proto::DeclareTensorRequest& r, codec::DType dtype,
                                        const cluster::OptimizerOptions& opt, bool fresh,
                                        Placement* placement = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For a tensor of many chunks not declared yet: its placement under the current map,
  // computed outside mu_ (millions of chunks take seconds, which every call would otherwise
  // wait for, even when the declaration is then refused); nullopt when not worth it;
  // ResourceExhausted when its memory does not fit the budget.
  absl::StatusOr<std::optional<Placement>> PlaceUnlocked(const proto::DeclareTensorRequest& r,
                                                         const cluster::ChunkLayout& layout,
                                                         codec::DType dtype,
                                                         const cluster::OptimizerOptions& opt)
      ABSL_LOCKS_EXCLUDED(mu_);
  // ResourceExhausted when a tensor of many chunks (1024 a shard or more) cannot fit:
  // half this shard's expected share of its state must fit in the memory budget now.
  absl::Status CheckShareFits(const proto::DeclareTensorRequest& r,
                              const cluster::ChunkLayout& layout, codec::DType dtype,
                              const cluster::OptimizerOptions& opt, uint32_t shards) const;
  // Old-map pushes while a re-shard is prepared or committed: waits while `step` is past
  // the frozen step; Aborted once it is at or past the switch step or the map changed.
  absl::Status WaitWhileFrozen(uint64_t epoch, int64_t step, absl::Time deadline) const;
  // Waits on mu_ until `ready` or `deadline`; whether `ready`.
  bool AwaitLocked(const std::function<bool()>& ready, absl::Time deadline) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // AwaitLocked for a call waiting until this shard reaches `epoch`, counted against
  // options_.max_waiting_for_epoch: ResourceExhausted (a busy refusal) when that many wait.
  // Peers' transfers of moved state are counted apart (against half as many), so that
  // workers' calls cannot crowd out the state the switch waits for.
  enum class EpochWaiter { kCall, kTransfer };
  absl::Status AwaitEpochLocked(const std::function<bool()>& ready, absl::Time deadline,
                                uint64_t epoch, EpochWaiter who = EpochWaiter::kCall) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Drops a prepared re-shard whose Commit did not come in time.
  void ExpirePrepareLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The committed re-shard: waits for the switch step, switches, sends moved chunks.
  void RunSwitch();
  absl::Status SendMoved(const proto::ClusterConfig& next,
                         std::map<uint32_t, std::vector<proto::ChunkState>> moved,
                         const std::vector<proto::TensorDeclaration>& declarations,
                         uint32_t from_shard);
  std::string SupersededMessage(uint64_t epoch) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Unavailable when this shard may not acknowledge anything (options_.cluster_state: its
  // lease is not provably alive, or the committed map has it down).
  absl::Status CheckMayAcknowledge() const;
  // Replication: sends `snap` of an owned chunk to its backups (the accumulator's
  // replicate hook). A backup that cannot be reached is reported down first.
  absl::Status ReplicateChunk(const std::string& key, uint32_t chunk, const ChunkSnapshot& snap);
  // Recomputes `t`'s live replica sets, owners and backup entries under the map served
  // now; returns the backup entries of chunks this shard no longer backs up.
  absl::flat_hash_map<uint32_t, TensorBackup> AssignRolesLocked(Tensor* t)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Makes this shard the owner of `chunk` with the state its backup entry holds.
  absl::Status PromoteLocked(Tensor* t, uint32_t chunk, TensorBackup backup, uint64_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The coordinator's part of ReportDown (serialized by failover_mu_).
  absl::Status CoordinateFailover(const proto::ReportDownRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(failover_mu_);
  // Installs `next` (its epoch already raised) on every shard not down in it, this one last;
  // a shard that cannot be reached is added to the down ones and the epoch raised again.
  absl::Status DistributeMap(proto::ClusterConfig next, const std::string& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(failover_mu_);
  // A restarted shard's way back: find the running job, ask to join, catch up, ask again.
  void RejoinLoop();
  // Every change of phase_, so that the re-shard gauge follows it.
  // const: an expired Prepare is undone from const checks (phase_ is mutable).
  void SetPhaseLocked(Phase phase) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Joining, and every chunk this shard backs up holds its owner's state.
  // Asks shard k (at `address`) whether it restarted (rejoining), or caught up when
  // `caught_up`: FailedPrecondition naming what it reports otherwise.
  absl::Status CheckRejoinClaim(const std::string& address, uint32_t k, bool caught_up)
      ABSL_LOCKS_EXCLUDED(mu_);
  bool CaughtUpLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::string ShardName(uint32_t index) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // CheckJobAndEpoch, the key's limits, then the declared tensor (NotFound if none).
  absl::StatusOr<Tensor*> FindTensor(const std::string& job, uint64_t epoch,
                                     const std::string& key, absl::Time deadline) const;
  // The accumulator of `chunk` of `t`: InvalidArgument past the last chunk, DataLoss for a
  // lost chunk, FailedPrecondition naming the owner when another shard owns it.
  absl::StatusOr<std::shared_ptr<StepAccumulator>> OwnedChunk(const Tensor& t,
                                                              uint32_t chunk) const;
  using ReplyDone =
      absl::AnyInvocable<void(absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>>) &&>;
  void PushPullImpl(const proto::CompressedBlock& request, cluster::WirePieces data,
                    absl::Time deadline, ReplyDone done);
  // PushPullImpl's checks and decode: an error, or OK with *done handed to the chunk.
  absl::Status PushPullStart(const proto::CompressedBlock& request, cluster::WirePieces data,
                             absl::Time deadline, ReplyDone* done);
  void CountPushOutcome(const proto::CompressedBlock& request, const absl::Status& s);
  // Whether a call of `epoch` may wait for a map (a re-shard or failover under way): such a
  // push runs on a thread of its own, so that the pool stays free for the pushes that
  // complete the steps the switch waits for.
  bool MayWaitForMap(uint64_t epoch) const;
  std::string WorkerName(uint32_t worker) const;
  // The request's own checks that need no shard state (key length, job, epoch).
  absl::Status CheckKey(const std::string& key) const;
  // FailedPrecondition naming each setting of the registering worker's config (where it
  // sends them) that differs from this shard's: uplink codec, chunk_bytes, workers.
  absl::Status CheckWorkerConfig(const proto::RegisterWorkerRequest& r) const;
  // The longest name a peer's chunk state may carry: a key, or this job's name.
  size_t MaxNameBytes() const {
    return std::max<size_t>(config_.limits().max_key_bytes(), config_.job().size());
  }
  // AlreadyExists when another process registered as `worker` after the one whose
  // `session` a push carries (session 0, from older clients, is not checked).
  absl::Status CheckSession(uint32_t worker, uint64_t session) const;
  // Memory a declaration makes this shard keep: the owner table, then per owned chunk its
  // optimizer state, cached result (at the codec's bound) and bookkeeping.
  static uint64_t OwnerTableBytes(const std::string& key, const cluster::ChunkLayout& layout,
                                  uint32_t replicas);
  uint64_t OwnedChunkBytes(const cluster::ChunkLayout& layout, codec::DType dtype,
                           const cluster::OptimizerOptions& optimizer, uint32_t chunk) const;

  // Constant after construction; a re-shard changes only `shards` and `shard_map_epoch`,
  // which live in map_config_ (config_ keeps the ones the shard started with).
  const proto::ClusterConfig config_;
  const ShardOptions options_;
  const std::string checkpoint_dir_;  // this job's sets (cluster::JobCheckpointDir); "": none
  const std::string self_address_;  // this process's address in every map
  const cluster::DirectionCodec downlink_;
  std::unique_ptr<ThreadPool> pool_;
  // Replication of completed steps to the backups (peer calls, which a dead backup holds for
  // a call deadline): off `pool_`, so that pushes are still decoded meanwhile. Null with
  // one copy. Emptied before `pool_` (its work answers on `pool_`).
  std::unique_ptr<ThreadPool> replication_pool_;
  // Thread-safe; both outlive every accumulator (declared before tensors_).
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<ShardMetrics> metrics_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  // The map served now.
  proto::ClusterConfig map_config_ ABSL_GUARDED_BY(mu_);
  cluster::ShardMap shard_map_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> epoch_;         // map_config_'s, for readers without mu_
  std::atomic<uint32_t> shard_index_;   // this shard's index in it
  std::atomic<uint32_t> map_shards_;    // and its number of shards

  // Re-sharding.
  mutable Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kServing;
  proto::ClusterConfig next_config_ ABSL_GUARDED_BY(mu_);  // prepared or committed
  mutable int64_t freeze_after_ ABSL_GUARDED_BY(mu_) = kMaxStep;  // old-map pushes past it wait
  int64_t switch_step_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time prepare_deadline_ ABSL_GUARDED_BY(mu_);
  // Calls and transfers waiting in AwaitEpochLocked.
  mutable uint32_t waiting_for_epoch_[2] ABSL_GUARDED_BY(mu_) = {0, 0};
  uint64_t left_epoch_ ABSL_GUARDED_BY(mu_) = 0;  // the newest epoch a re-shard replaced
  mutable bool joining_ ABSL_GUARDED_BY(mu_) = false;  // prepared, only in the new map
  uint32_t joining_old_shards_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t fill_expected_ ABSL_GUARDED_BY(mu_) = 0;  // old shards whose share is awaited
  std::set<uint32_t> fill_done_ ABSL_GUARDED_BY(mu_);
  // Moved chunks arrive in parts (one state array each); merged here until complete.
  std::map<std::pair<std::string, uint32_t>, proto::ChunkState> partial_ ABSL_GUARDED_BY(mu_);
  absl::Time switched_at_ ABSL_GUARDED_BY(mu_);
  bool moves_sent_ ABSL_GUARDED_BY(mu_) = true;
  bool transfer_seen_ ABSL_GUARDED_BY(mu_) = false;  // this shard's share of the last re-shard
  double pause_ms_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t chunks_sent_ ABSL_GUARDED_BY(mu_) = 0, bytes_sent_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t chunks_received_ ABSL_GUARDED_BY(mu_) = 0, chunks_kept_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread switch_thread_;
  // From a commit until its switch thread has sent the moved chunks (or given up): no
  // other re-shard may be prepared meanwhile.
  bool switch_running_ ABSL_GUARDED_BY(mu_) = false;

  // Replication and failover.
  const uint32_t replicas_;
  std::vector<bool> down_ ABSL_GUARDED_BY(mu_);     // by shard index, from map_config_
  std::vector<bool> joining_shards_ ABSL_GUARDED_BY(mu_);  // likewise
  bool rejoining_ ABSL_GUARDED_BY(mu_) = false;     // restarted: not serving yet
  // The thread restoring a set while rejoining_ holds (EnterRunAndRestore): its declarations
  // pass, everyone else's wait.
  std::thread::id restoring_thread_ ABSL_GUARDED_BY(mu_);
  // With etcd: the run this shard entered or rejoins (coord/job_run.h), and whether it
  // rejoins (the run decided it; no peer is asked).
  uint64_t run_generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool run_says_rejoin_ ABSL_GUARDED_BY(mu_) = false;
  absl::Mutex rejoin_thread_mu_;  // before mu_
  std::thread rejoin_thread_ ABSL_GUARDED_BY(rejoin_thread_mu_);
  absl::Mutex failover_mu_;  // one coordinated failover at a time; before mu_
  // ReportDown calls waiting for failover_mu_ or holding it (at most kMaxFailoverWaiters).
  static constexpr int kMaxFailoverWaiters = 16;
  static constexpr int kReplicationThreads = 8;  // replication_pool_
  std::atomic<int> failover_waiters_{0};
  uint64_t failovers_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t chunks_promoted_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t chunks_lost_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> replications_sent_{0};

  // Periodic checkpoints; taken inside accumulator locks (never the other way round).
  mutable absl::Mutex ckpt_mu_;
  std::map<int64_t, PendingCheckpoint> pending_ckpt_ ABSL_GUARDED_BY(ckpt_mu_);
  std::deque<std::pair<int64_t, PendingCheckpoint>> ready_ckpt_ ABSL_GUARDED_BY(ckpt_mu_);
  // The newest boundary whose set went to the writer: a snapshot of it or an earlier one
  // that comes later (a chunk that lagged past a filled set) is dropped.
  int64_t ckpt_dispatched_step_ ABSL_GUARDED_BY(ckpt_mu_) = -1;
  bool ckpt_writing_ ABSL_GUARDED_BY(ckpt_mu_) = false;
  bool ckpt_stop_ ABSL_GUARDED_BY(ckpt_mu_) = false;
  std::thread ckpt_thread_;
  absl::Mutex expiry_mu_;
  bool expiry_stop_ ABSL_GUARDED_BY(expiry_mu_) = false;
  std::thread expiry_thread_;
  // Pushes on threads of their own (MayWaitForMap); the destructor waits for them.
  absl::Mutex map_waits_mu_;
  int map_waits_ ABSL_GUARDED_BY(map_waits_mu_) = 0;
  std::string restored_from_;
  int64_t restored_step_ = -1;

  // Separate from mu_: accumulators ask for names while holding their own locks.
  mutable absl::Mutex names_mu_;
  std::vector<std::string> worker_names_ ABSL_GUARDED_BY(names_mu_);
  // The session of the process that last registered as each worker (0: none yet); atomic,
  // since every push reads it.
  const std::unique_ptr<std::atomic<uint64_t>[]> worker_sessions_;

  std::atomic<uint64_t> pushes_{0};
  // Chunk-steps completed and failed here since the start: counted as they happen, so that
  // chunks moved away by a re-shard take nothing back (as the Prometheus counters).
  std::atomic<uint64_t> steps_completed_{0};
  std::atomic<uint64_t> steps_failed_{0};
  std::atomic<uint64_t> duplicate_pushes_{0};
  std::atomic<uint64_t> rejected_pushes_{0};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  std::atomic<uint64_t> raw_bytes_in_{0};
  std::atomic<uint64_t> chunks_owned_{0};
  std::atomic<uint64_t> tensors_declared_{0};  // new tensors ever declared here
  std::atomic<uint64_t> raw_bytes_out_{0};
  const absl::Time started_ = absl::Now();
  // The last rejected push's status for Stats (operators' "last error"), truncated.
  mutable absl::Mutex last_error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(last_error_mu_);
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_SHARD_SERVICE_H_
