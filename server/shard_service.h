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
//   Unavailable         the shard is shutting down
#ifndef GCOMP_SERVER_SHARD_SERVICE_H_
#define GCOMP_SERVER_SHARD_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/thread_pool.h"
#include "proto/aggregation.pb.h"
#include "proto/cluster_config.pb.h"
#include "cluster/cluster_config.h"
#include "cluster/shard_map.h"
#include "server/admission.h"
#include "server/shard_metrics.h"
#include "server/step_accumulator.h"

namespace gcomp::server {

struct ShardOptions {
  uint32_t shard = 0;
  // Threads that decode and convert pushed blocks.
  int decode_threads = 4;
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

  absl::Status RegisterWorker(const proto::RegisterWorkerRequest& request,
                              proto::RegisterWorkerResponse* response);
  absl::Status DeclareTensor(const proto::DeclareTensorRequest& request,
                             proto::DeclareTensorResponse* response);
  // Waits until the step completes or fails, or `deadline` passes.
  absl::Status PushPull(const proto::CompressedBlock& request, absl::Time deadline,
                        proto::CompressedBlock* response);
  absl::Status Pull(const proto::PullRequest& request, proto::CompressedBlock* response);
  void Stats(proto::StatsResponse* response) const;

  // Ends every wait and refuses later calls with Unavailable.
  void Shutdown();

  // Writes the checkpoint set "final" (every chunk at its last completed step) into
  // `checkpoint.dir`; call after Shutdown (SIGTERM). FailedPrecondition without a dir.
  absl::Status WriteFinalCheckpoint();
  // Waits until the periodic checkpoints queued so far are written (tests, shutdown).
  void FlushCheckpoints();
  // What the start-up restore loaded: the set's directory and step ("" / -1 if none).
  const std::string& restored_from() const { return restored_from_; }
  int64_t restored_step() const { return restored_step_; }

  uint32_t shard() const { return options_.shard; }
  AdmissionUsage admission_usage() const { return admission_->usage(); }
  // The shard's Prometheus metrics (served on /metrics by gcomp_server).
  ShardMetrics* metrics() const { return metrics_.get(); }
  const proto::ClusterConfig& config() const { return config_; }

 private:
  struct Tensor;

  // Snapshots of one step boundary, gathered chunk by chunk until every owned chunk is in.
  struct PendingCheckpoint {
    std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> chunks;
    uint64_t reserved_bytes = 0;
    bool refused = false;  // a snapshot did not fit the memory budget: the step is skipped
  };

  ShardService(proto::ClusterConfig config, const ShardOptions& options);
  absl::Status RestoreFromCheckpoint();
  // Called by a chunk's accumulator (under its lock) at a checkpoint step boundary.
  void OnSnapshot(const std::string& key, uint32_t chunk, ChunkSnapshot snapshot);
  void CheckpointLoop();
  // Encodes and writes one shard file of the set (final or the periodic one of `step`).
  absl::Status WriteCheckpoint(bool final, int64_t step,
                               std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> chunks);
  // NotFound for another job, FailedPrecondition for another shard-map epoch.
  absl::Status CheckJobAndEpoch(const std::string& job, uint64_t epoch) const;
  // CheckJobAndEpoch, the key's limits, then the declared tensor (NotFound if none).
  absl::StatusOr<Tensor*> FindTensor(const std::string& job, uint64_t epoch,
                                     const std::string& key) const;
  // The accumulator of `chunk` of `t`: InvalidArgument past the last chunk,
  // FailedPrecondition naming the owner when another shard owns it.
  absl::StatusOr<StepAccumulator*> OwnedChunk(const Tensor& t, const std::string& key,
                                              uint32_t chunk) const;
  absl::Status PushPullImpl(const proto::CompressedBlock& request, absl::Time deadline,
                            proto::CompressedBlock* response);
  std::string WorkerName(uint32_t worker) const;
  // The request's own checks that need no shard state (key length, job, epoch).
  absl::Status CheckKey(const std::string& key) const;
  // Memory a declaration makes this shard keep: the owner table, then per owned chunk its
  // optimizer state, cached result (at the codec's bound) and bookkeeping.
  static uint64_t OwnerTableBytes(const std::string& key, const cluster::ChunkLayout& layout);
  uint64_t OwnedChunkBytes(const cluster::ChunkLayout& layout, codec::DType dtype,
                           const cluster::OptimizerOptions& optimizer, uint32_t chunk) const;

  // Constant after construction.
  const proto::ClusterConfig config_;
  const ShardOptions options_;
  const cluster::ShardMap shard_map_;
  const cluster::DirectionCodec downlink_;
  std::unique_ptr<ThreadPool> pool_;
  // Thread-safe; both outlive every accumulator (declared before tensors_).
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<ShardMetrics> metrics_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Tensor>> tensors_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;

  // Periodic checkpoints; taken inside accumulator locks (never the other way round).
  mutable absl::Mutex ckpt_mu_;
  std::map<int64_t, PendingCheckpoint> pending_ckpt_ ABSL_GUARDED_BY(ckpt_mu_);
  std::deque<std::pair<int64_t, PendingCheckpoint>> ready_ckpt_ ABSL_GUARDED_BY(ckpt_mu_);
  bool ckpt_writing_ ABSL_GUARDED_BY(ckpt_mu_) = false;
  bool ckpt_stop_ ABSL_GUARDED_BY(ckpt_mu_) = false;
  std::thread ckpt_thread_;
  std::string restored_from_;
  int64_t restored_step_ = -1;

  // Separate from mu_: accumulators ask for names while holding their own locks.
  mutable absl::Mutex names_mu_;
  std::vector<std::string> worker_names_ ABSL_GUARDED_BY(names_mu_);

  std::atomic<uint64_t> pushes_{0};
  std::atomic<uint64_t> duplicate_pushes_{0};
  std::atomic<uint64_t> rejected_pushes_{0};
  std::atomic<uint64_t> bytes_in_{0};
  std::atomic<uint64_t> bytes_out_{0};
  std::atomic<uint64_t> raw_bytes_in_{0};
  std::atomic<uint64_t> chunks_owned_{0};
  std::atomic<uint64_t> raw_bytes_out_{0};
  const absl::Time started_ = absl::Now();
  // The last rejected push's status for Stats (operators' "last error"), truncated.
  mutable absl::Mutex last_error_mu_;
  std::string last_error_ ABSL_GUARDED_BY(last_error_mu_);
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_SHARD_SERVICE_H_
