#include "server/shard_metrics.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace gcomp::server {
namespace {

// Step latencies from 100 us to ~100 s, a factor of about 2 apart.
prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  std::vector<double> b;
  for (double v = 1e-4; v < 120; v *= 2) b.push_back(v);
  return b;
}

}  // namespace

ShardMetrics::ShardMetrics(const std::string& job, uint32_t shard)
    : registry_(std::make_shared<prometheus::Registry>()) {
  const std::map<std::string, std::string> labels = {{"gcomp_job", job},
                                                     {"shard", absl::StrCat(shard)}};
  prometheus::Registry& r = *registry_;
  auto& raw = prometheus::BuildCounter()
                  .Name("gcomp_shard_raw_bytes_total")
                  .Help("Tensor bytes of accepted pushes (in) and of replies (out), as if uncompressed.")
                  .Labels(labels)
                  .Register(r);
  raw_in_ = &raw.Add({{"direction", "in"}});
  raw_out_ = &raw.Add({{"direction", "out"}});
  auto& wire = prometheus::BuildCounter()
                   .Name("gcomp_shard_wire_bytes_total")
                   .Help("Encoded block bytes of accepted pushes (in) and of replies (out).")
                   .Labels(labels)
                   .Register(r);
  wire_in_ = &wire.Add({{"direction", "in"}});
  wire_out_ = &wire.Add({{"direction", "out"}});
  auto& ratio = prometheus::BuildGauge()
                    .Name("gcomp_shard_compression_ratio")
                    .Help("Raw bytes over wire bytes since the shard started, per direction.")
                    .Labels(labels)
                    .Register(r);
  ratio_in_ = &ratio.Add({{"direction", "in"}});
  ratio_out_ = &ratio.Add({{"direction", "out"}});
  pushes_ = &prometheus::BuildCounter()
                 .Name("gcomp_shard_pushes_total")
                 .Help("PushPull calls by result status code.")
                 .Labels(labels)
                 .Register(r);
  duplicates_ = &prometheus::BuildCounter()
                     .Name("gcomp_shard_duplicate_pushes_total")
                     .Help("Retried pushes answered without counting them again.")
                     .Labels(labels)
                     .Register(r)
                     .Add({});
  unread_replies_cancelled_ = &prometheus::BuildCounter()
                                   .Name("gcomp_shard_unread_replies_cancelled_total")
                                   .Help(
                                       "Replies a client left unread too long or too many "
                                       "of, whose calls the shard cancelled.")
                                   .Labels(labels)
                                   .Register(r)
                                   .Add({});
  stream_limit_closures_ = &prometheus::BuildCounter()
                                .Name("gcomp_shard_stream_limit_closures_total")
                                .Help(
                                    "Connections shut down for holding more HTTP/2 streams "
                                    "open than allowed (a peer that ignores the stream limit "
                                    "or resets streams in a flood) or for sending more bytes "
                                    "than their streams could carry (a frame flood).")
                                .Labels(labels)
                                .Register(r)
                                .Add({});
  refused_address_connections_ = &prometheus::BuildCounter()
                                      .Name("gcomp_shard_refused_address_connections_total")
                                      .Help(
                                          "New connections closed at once because their "
                                          "address was refused for a while after one of its "
                                          "connections was shut down by the stream guard.")
                                      .Labels(labels)
                                      .Register(r)
                                      .Add({});
  auto& codec_bytes = prometheus::BuildCounter()
                          .Name("gcomp_shard_codec_bytes_total")
                          .Help("Raw tensor bytes decoded from pushes and encoded into replies.")
                          .Labels(labels)
                          .Register(r);
  codec_bytes_decode_ = &codec_bytes.Add({{"op", "decode"}});
  codec_bytes_encode_ = &codec_bytes.Add({{"op", "encode"}});
  auto& codec_seconds = prometheus::BuildCounter()
                            .Name("gcomp_shard_codec_seconds_total")
                            .Help("Seconds spent decoding pushes and encoding replies "
                                  "(rate(bytes) / rate(seconds) is the codec's speed).")
                            .Labels(labels)
                            .Register(r);
  codec_seconds_decode_ = &codec_seconds.Add({{"op", "decode"}});
  codec_seconds_encode_ = &codec_seconds.Add({{"op", "encode"}});
  steps_completed_ = &prometheus::BuildCounter()
                          .Name("gcomp_shard_steps_completed_total")
                          .Help("Chunk-steps aggregated (one per owned chunk per training step).")
                          .Labels(labels)
                          .Register(r)
                          .Add({});
  checkpoints_ = &prometheus::BuildCounter()
                      .Name("gcomp_shard_checkpoints_total")
                      .Help("Checkpoint files this shard wrote (docs/CHECKPOINT.md).")
                      .Labels(labels)
                      .Register(r)
                      .Add({});
  checkpoint_step_ = &prometheus::BuildGauge()
                          .Name("gcomp_shard_checkpoint_last_step")
                          .Help("The training step of the newest checkpoint this shard wrote "
                                "(-1: none since it started).")
                          .Labels(labels)
                          .Register(r)
                          .Add({});
  checkpoint_step_->Set(-1);
  checkpoint_time_ = &prometheus::BuildGauge()
                          .Name("gcomp_shard_checkpoint_last_timestamp_seconds")
                          .Help("Unix time the newest checkpoint this shard wrote was done "
                                "(0: none since it started).")
                          .Labels(labels)
                          .Register(r)
                          .Add({});
  checkpoint_every_ = &prometheus::BuildGauge()
                          .Name("gcomp_shard_checkpoint_every_steps")
                          .Help("checkpoint.every_steps of the shard's config (0: none).")
                          .Labels(labels)
                          .Register(r)
                          .Add({});
  newest_step_ = &prometheus::BuildGauge()
                      .Name("gcomp_shard_completed_step")
                      .Help("The newest training step any chunk this shard owns completed "
                            "(-1: none since it started).")
                      .Labels(labels)
                      .Register(r)
                      .Add({});
  newest_step_->Set(-1);
  reshard_in_progress_ = &prometheus::BuildGauge()
                              .Name("gcomp_shard_reshard_in_progress")
                              .Help("1 while a re-shard is under way on this shard (prepared, "
                                    "committed, or receiving moved chunks), else 0.")
                              .Labels(labels)
                              .Register(r)
                              .Add({});
  reshard_requested_ = &prometheus::BuildGauge()
                            .Name("gcomp_shard_reshard_requested")
                            .Help("1 while this shard coordinates and the job's re-shard record "
                                  "in etcd is asked for or committed and not finished, else 0.")
                            .Labels(labels)
                            .Register(r)
                            .Add({});
  checkpoint_bytes_ = &prometheus::BuildCounter()
                           .Name("gcomp_shard_checkpoint_bytes_total")
                           .Help("Bytes of the checkpoint files this shard wrote.")
                           .Labels(labels)
                           .Register(r)
                           .Add({});
  checkpoint_seconds_ = &prometheus::BuildCounter()
                             .Name("gcomp_shard_checkpoint_seconds_total")
                             .Help("Seconds spent encoding and writing checkpoint files.")
                             .Labels(labels)
                             .Register(r)
                             .Add({});
  steps_failed_ = &prometheus::BuildCounter()
                       .Name("gcomp_shard_steps_failed_total")
                       .Help("Chunk-steps that timed out or failed to encode.")
                       .Labels(labels)
                       .Register(r)
                       .Add({});
  step_seconds_ = &prometheus::BuildHistogram()
                       .Name("gcomp_shard_step_duration_seconds")
                       .Help("Chunk-step latency: first push to result.")
                       .Labels(labels)
                       .Register(r)
                       .Add({}, LatencyBuckets());
  auto& phases = prometheus::BuildHistogram()
                     .Name("gcomp_shard_step_phase_seconds")
                     .Help(
                         "Parts of a chunk-step: waiting for the last worker, decoding one "
                         "push, the sum's last additions and the optimizer, encoding the "
                         "result.")
                     .Labels(labels)
                     .Register(r);
  phase_wait_ = &phases.Add({{"phase", "straggler_wait"}}, LatencyBuckets());
  phase_decode_ = &phases.Add({{"phase", "decode"}}, LatencyBuckets());
  phase_reduce_ = &phases.Add({{"phase", "reduce"}}, LatencyBuckets());
  phase_encode_ = &phases.Add({{"phase", "encode"}}, LatencyBuckets());
  memory_budget_ = &prometheus::BuildGauge()
                        .Name("gcomp_shard_memory_budget_bytes")
                        .Help("The shard's memory budget (limits.memory_budget_bytes or derived).")
                        .Labels(labels)
                        .Register(r)
                        .Add({});
  memory_used_ = &prometheus::BuildGauge()
                      .Name("gcomp_shard_memory_used_bytes")
                      .Help("Bytes reserved against the memory budget.")
                      .Labels(labels)
                      .Register(r)
                      .Add({});
  pending_steps_ = &prometheus::BuildGauge()
                        .Name("gcomp_shard_pending_steps")
                        .Help("Chunks whose step holds some but not all workers' pushes.")
                        .Labels(labels)
                        .Register(r)
                        .Add({});
  limit_refusals_ = &prometheus::BuildCounter()
                         .Name("gcomp_shard_limit_refusals_total")
                         .Help("Requests refused by a limit (memory budget, tensors, pending steps).")
                         .Labels(labels)
                         .Register(r)
                         .Add({});
  tensors_ = &prometheus::BuildGauge()
                  .Name("gcomp_shard_tensors")
                  .Help("Tensors declared on this shard.")
                  .Labels(labels)
                  .Register(r)
                  .Add({});
  chunks_owned_ = &prometheus::BuildGauge()
                       .Name("gcomp_shard_chunks_owned")
                       .Help("Chunks this shard owns under the current shard map.")
                       .Labels(labels)
                       .Register(r)
                       .Add({});
  epoch_ = &prometheus::BuildGauge()
                .Name("gcomp_shard_map_epoch")
                .Help("The shard-map epoch this shard serves.")
                .Labels(labels)
                .Register(r)
                .Add({});
  down_shards_ = &prometheus::BuildGauge()
                      .Name("gcomp_shard_down_shards")
                      .Help("Shards a failover took out of the map this shard serves.")
                      .Labels(labels)
                      .Register(r)
                      .Add({});
  degraded_ = &prometheus::BuildGauge()
                   .Name("gcomp_shard_replication_degraded")
                   .Help("1 while shards are down: some chunks have fewer copies than `replicas`.")
                   .Labels(labels)
                   .Register(r)
                   .Add({});
  failovers_ = &prometheus::BuildCounter()
                    .Name("gcomp_shard_failover_maps_total")
                    .Help("Failover maps (shards down, joining or back) installed on this shard.")
                    .Labels(labels)
                    .Register(r)
                    .Add({});
  chunks_promoted_ = &prometheus::BuildCounter()
                          .Name("gcomp_shard_chunks_taken_over_total")
                          .Help("Chunks this shard took over from its backup copies.")
                          .Labels(labels)
                          .Register(r)
                          .Add({});
  chunks_lost_ = &prometheus::BuildCounter()
                      .Name("gcomp_shard_chunks_lost_total")
                      .Help("Chunks whose every copy went down at once (their steps fail).")
                      .Labels(labels)
                      .Register(r)
                      .Add({});
  calls_in_flight_ = &prometheus::BuildGauge()
                          .Name("gcomp_grpc_calls_in_flight")
                          .Help("gRPC calls being served, per method.")
                          .Labels(labels)
                          .Register(r);
}

ShardMetrics::~ShardMetrics() = default;

void ShardMetrics::CountPush(absl::StatusCode code) {
  prometheus::Counter* c = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = push_codes_.find(static_cast<int>(code));
    if (it == push_codes_.end()) {
      c = &pushes_->Add({{"code", absl::StatusCodeToString(code)}});
      push_codes_[static_cast<int>(code)] = c;
    } else {
      c = it->second;
    }
  }
  c->Increment();
}

void ShardMetrics::CountDuplicate() { duplicates_->Increment(); }

void ShardMetrics::CountUnreadRepliesCancelled(uint64_t replies) {
  unread_replies_cancelled_->Increment(static_cast<double>(replies));
}

void ShardMetrics::CountStreamLimitClosures(uint64_t connections) {
  stream_limit_closures_->Increment(static_cast<double>(connections));
}

void ShardMetrics::CountRefusedAddressConnection() { refused_address_connections_->Increment(); }

void ShardMetrics::UpdateRatios() {
  if (wire_in_->Value() > 0) ratio_in_->Set(raw_in_->Value() / wire_in_->Value());
  if (wire_out_->Value() > 0) ratio_out_->Set(raw_out_->Value() / wire_out_->Value());
}

void ShardMetrics::AddIn(uint64_t raw_bytes, uint64_t wire_bytes) {
  raw_in_->Increment(static_cast<double>(raw_bytes));
  wire_in_->Increment(static_cast<double>(wire_bytes));
  UpdateRatios();
}

void ShardMetrics::AddOut(uint64_t raw_bytes, uint64_t wire_bytes) {
  raw_out_->Increment(static_cast<double>(raw_bytes));
  wire_out_->Increment(static_cast<double>(wire_bytes));
  UpdateRatios();
}

void ShardMetrics::ObserveDecode(uint64_t raw_bytes, double seconds) {
  codec_bytes_decode_->Increment(static_cast<double>(raw_bytes));
  codec_seconds_decode_->Increment(seconds);
  phase_decode_->Observe(seconds);
}

void ShardMetrics::ObserveStep(const StepTimings& t, uint64_t raw_bytes_encoded) {
  steps_completed_->Increment();
  int64_t seen = newest_step_seen_.load(std::memory_order_relaxed);
  while (t.step > seen &&
         !newest_step_seen_.compare_exchange_weak(seen, t.step, std::memory_order_relaxed)) {
  }
  if (t.step > seen) newest_step_->Set(static_cast<double>(t.step));
  step_seconds_->Observe(absl::ToDoubleSeconds(t.total));
  phase_wait_->Observe(absl::ToDoubleSeconds(t.straggler_wait));
  phase_reduce_->Observe(absl::ToDoubleSeconds(t.reduce));
  phase_encode_->Observe(absl::ToDoubleSeconds(t.encode));
  codec_bytes_encode_->Increment(static_cast<double>(raw_bytes_encoded));
  codec_seconds_encode_->Increment(absl::ToDoubleSeconds(t.encode));
}

void ShardMetrics::CountStepFailed() { steps_failed_->Increment(); }

void ShardMetrics::SetReshardRequested(bool requested) {
  reshard_requested_->Set(requested ? 1 : 0);
}

void ShardMetrics::SetReshardInProgress(bool in_progress) {
  reshard_in_progress_->Set(in_progress ? 1 : 0);
}

void ShardMetrics::SetCheckpointInterval(uint32_t every_steps) {
  checkpoint_every_->Set(every_steps);
}

void ShardMetrics::ObserveCheckpoint(uint64_t bytes, double seconds, int64_t step) {
  checkpoints_->Increment();
  checkpoint_step_->Set(static_cast<double>(step));
  checkpoint_time_->SetToCurrentTime();
  checkpoint_bytes_->Increment(static_cast<double>(bytes));
  checkpoint_seconds_->Increment(seconds);
}

void ShardMetrics::SetAdmission(const AdmissionUsage& usage, uint64_t budget_bytes) {
  memory_budget_->Set(static_cast<double>(budget_bytes));
  memory_used_->Set(static_cast<double>(usage.memory_bytes));
  pending_steps_->Set(static_cast<double>(usage.pending_steps));
  absl::MutexLock lock(&mu_);
  if (usage.refused > refusals_seen_) {
    limit_refusals_->Increment(static_cast<double>(usage.refused - refusals_seen_));
    refusals_seen_ = usage.refused;
  }
}

void ShardMetrics::SetReplication(uint64_t down_shards, bool degraded) {
  down_shards_->Set(static_cast<double>(down_shards));
  degraded_->Set(degraded ? 1 : 0);
}

void ShardMetrics::CountFailover() { failovers_->Increment(); }
void ShardMetrics::CountChunksPromoted(uint64_t chunks) { chunks_promoted_->Increment(chunks); }
void ShardMetrics::CountChunksLost(uint64_t chunks) { chunks_lost_->Increment(chunks); }

void ShardMetrics::SetTensors(uint64_t tensors, uint64_t chunks_owned, uint64_t shard_map_epoch) {
  tensors_->Set(static_cast<double>(tensors));
  chunks_owned_->Set(static_cast<double>(chunks_owned));
  epoch_->Set(static_cast<double>(shard_map_epoch));
}

ShardMetrics::InFlight::InFlight(prometheus::Gauge* gauge) : gauge_(gauge) { gauge_->Increment(); }

ShardMetrics::InFlight::~InFlight() {
  if (gauge_ != nullptr) gauge_->Decrement();
}

ShardMetrics::InFlight ShardMetrics::Track(absl::string_view method) {
  prometheus::Gauge* g = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = methods_.find(method);
    if (it == methods_.end()) {
      g = &calls_in_flight_->Add({{"method", std::string(method)}});
      methods_[std::string(method)] = g;
    } else {
      g = it->second;
    }
  }
  return InFlight(g);
}

std::string ShardMetrics::Text() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace gcomp::server
