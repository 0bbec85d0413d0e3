// The shard's Prometheus metrics (docs/OPERATIONS.md lists every series). Counters and
// histograms are updated on the hot path with atomic adds; gauges are set when what they
// show changes. Every series carries the const labels gcomp_job (the config's job; not
// "job", which is Prometheus's own target label) and shard, so label cardinality stays
// bounded (never a tensor key). Thread-safe.
#ifndef GCOMP_SERVER_SHARD_METRICS_H_
#define GCOMP_SERVER_SHARD_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "server/admission.h"
#include "server/step_accumulator.h"

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace gcomp::server {

class ShardMetrics {
 public:
  ShardMetrics(const std::string& job, uint32_t shard);
  ~ShardMetrics();
  ShardMetrics(const ShardMetrics&) = delete;
  ShardMetrics& operator=(const ShardMetrics&) = delete;

  // What the /metrics exposer serves.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  // A push's outcome, by status code ("OK", "DATA_LOSS", ...).
  void CountPush(absl::StatusCode code);
  void CountDuplicate();
  // Calls cancelled because their client did not read the replies (server/unread_replies.h).
  void CountUnreadRepliesCancelled(uint64_t replies);
  // Connections shut down for more HTTP/2 streams open than allowed, and new ones closed
  // because their address was refused after that (server/stream_guard.h).
  void CountStreamLimitClosures(uint64_t connections);
  void CountRefusedAddressConnection();
  // Bytes of an accepted push (in) or of a reply (out): as raw tensor bytes and on the wire.
  void AddIn(uint64_t raw_bytes, uint64_t wire_bytes);
  void AddOut(uint64_t raw_bytes, uint64_t wire_bytes);
  // One push decoded: raw bytes produced and the seconds it took.
  void ObserveDecode(uint64_t raw_bytes, double seconds);
  // One chunk-step completed (timings from its StepAccumulator) or failed.
  void ObserveStep(const StepTimings& timings, uint64_t raw_bytes_encoded);
  void CountStepFailed();
  // One checkpoint file written: its bytes, the seconds encoding and writing took, and the
  // step it holds (with the newest completed step, what an alert compares).
  void ObserveCheckpoint(uint64_t bytes, double seconds, int64_t step);
  // checkpoint.every_steps of the config (0: no periodic checkpoints).
  void SetCheckpointInterval(uint32_t every_steps);
  // Whether a re-shard is under way here (prepared, committed, or receiving moved chunks).
  void SetReshardInProgress(bool in_progress);
  // Whether this shard, coordinating, sees an unfinished re-shard in etcd's record (asked
  // for, or committed): also before any shard is prepared (an added pod never started).
  void SetReshardRequested(bool requested);
  void SetAdmission(const AdmissionUsage& usage, uint64_t budget_bytes);
  void SetTensors(uint64_t tensors, uint64_t chunks_owned, uint64_t shard_map_epoch);
  // Replication: shards down in the map served, whether some chunk has fewer live copies
  // than configured (degraded), and a failover map installed here (the map changed).
  void SetReplication(uint64_t down_shards, bool degraded);
  void CountFailover();
  void CountChunksPromoted(uint64_t chunks);
  void CountChunksLost(uint64_t chunks);

  // Counts a call of `method` in flight while it lives.
  class InFlight {
   public:
    explicit InFlight(prometheus::Gauge* gauge);
    InFlight(InFlight&& other) noexcept : gauge_(other.gauge_) { other.gauge_ = nullptr; }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;
    InFlight& operator=(InFlight&&) = delete;
    ~InFlight();

   private:
    prometheus::Gauge* gauge_;  // owned by the registry; null once moved from
  };
  InFlight Track(absl::string_view method);

  // The registry in Prometheus text format (tests and debugging).
  std::string Text() const;

 private:
  void UpdateRatios();

  // Constant after construction; the metric objects are owned by registry_.
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* pushes_;
  prometheus::Family<prometheus::Gauge>* calls_in_flight_;
  prometheus::Counter* duplicates_;
  prometheus::Counter* unread_replies_cancelled_;
  prometheus::Counter* stream_limit_closures_;
  prometheus::Counter* refused_address_connections_;
  prometheus::Counter* raw_in_;
  prometheus::Counter* raw_out_;
  prometheus::Counter* wire_in_;
  prometheus::Counter* wire_out_;
  prometheus::Gauge* ratio_in_;
  prometheus::Gauge* ratio_out_;
  prometheus::Counter* codec_bytes_decode_;
  prometheus::Counter* codec_bytes_encode_;
  prometheus::Counter* codec_seconds_decode_;
  prometheus::Counter* codec_seconds_encode_;
  prometheus::Counter* steps_completed_;
  prometheus::Counter* steps_failed_;
  prometheus::Counter* checkpoints_;
  prometheus::Counter* checkpoint_bytes_;
  prometheus::Counter* checkpoint_seconds_;
  prometheus::Gauge* checkpoint_step_;
  prometheus::Gauge* checkpoint_time_;
  prometheus::Gauge* checkpoint_every_;
  prometheus::Gauge* newest_step_;
  prometheus::Gauge* reshard_in_progress_;
  prometheus::Gauge* reshard_requested_;
  std::atomic<int64_t> newest_step_seen_{-1};
  prometheus::Histogram* step_seconds_;
  prometheus::Histogram* phase_wait_;
  prometheus::Histogram* phase_decode_;
  prometheus::Histogram* phase_reduce_;
  prometheus::Histogram* phase_encode_;
  prometheus::Gauge* memory_budget_;
  prometheus::Gauge* memory_used_;
  prometheus::Gauge* pending_steps_;
  prometheus::Counter* limit_refusals_;
  prometheus::Gauge* tensors_;
  prometheus::Gauge* chunks_owned_;
  prometheus::Gauge* epoch_;
  prometheus::Gauge* down_shards_;
  prometheus::Gauge* degraded_;
  prometheus::Counter* failovers_;
  prometheus::Counter* chunks_promoted_;
  prometheus::Counter* chunks_lost_;

  mutable absl::Mutex mu_;
  // Children of the labelled families, made on first use.
  absl::flat_hash_map<int, prometheus::Counter*> push_codes_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, prometheus::Gauge*> methods_ ABSL_GUARDED_BY(mu_);
  uint64_t refusals_seen_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_SHARD_METRICS_H_
