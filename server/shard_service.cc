#include "server/shard_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/logging.h"
#include "base/system_memory.h"
#include "cluster/wire_block.h"
#include "server/checkpoint.h"
#include "server/chunk_state.h"

namespace gcomp::server {

struct ShardService::Tensor {
  std::string key;
  codec::DType dtype = codec::DType::kF32;
  cluster::ChunkLayout layout;
  cluster::OptimizerOptions optimizer;
  proto::OptimizerConfig optimizer_config;  // as resolved at declaration (for checkpoints)
  std::vector<uint32_t> owner;
  // Owned chunks only; constant after creation (the accumulators are thread-safe).
  absl::flat_hash_map<uint32_t, std::unique_ptr<StepAccumulator>> chunks;
};

namespace {

absl::StatusOr<cluster::OptimizerOptions> OptimizerFrom(const proto::OptimizerConfig& c) {
  absl::StatusOr<cluster::OptimizerKind> kind = cluster::ParseOptimizerKind(c.name());
  if (!kind.ok()) return kind.status();
  cluster::OptimizerOptions o{*kind, c.learning_rate(), c.momentum(), c.beta1(), c.beta2(), c.epsilon()};
  absl::Status s = cluster::ValidateOptimizerOptions(o);
  if (!s.ok()) return s;
  return o;
}

// Bookkeeping per tensor and per owned chunk beyond the float arrays (the accumulator, map
// entries, per-worker vectors): an estimate on the high side, so the budget errs safe.
constexpr uint64_t kTensorOverheadBytes = 512;
constexpr uint64_t kChunkOverheadBytes = 1024;
// Stats.last_error stays one table cell's worth.
constexpr size_t kMaxLastErrorChars = 200;

// At most `max` bytes of `s`, cut before a UTF-8 continuation byte (a proto3 string must
// stay valid UTF-8).
std::string TruncateUtf8(const std::string& s, size_t max) {
  if (s.size() <= max) return s;
  size_t end = max;
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return s.substr(0, end);
}

bool SameOptimizer(const cluster::OptimizerOptions& a, const cluster::OptimizerOptions& b) {
  return a.kind == b.kind && a.learning_rate == b.learning_rate && a.momentum == b.momentum &&
         a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.epsilon == b.epsilon;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardService>> ShardService::Create(
    const proto::ClusterConfig& config, const ShardOptions& options) {
  absl::Status s = cluster::ValidateClusterConfig(config);
  if (!s.ok()) return s;
  if (options.shard >= static_cast<uint32_t>(config.shards_size())) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options.shard, " out of range: the config lists ",
                                                   config.shards_size(), " shards"));
  }
  if (options.decode_threads < 1) {
    return absl::InvalidArgumentError("decode_threads must be at least 1");
  }
  std::unique_ptr<ShardService> service(new ShardService(config, options));
  if (!config.checkpoint().dir().empty()) {
    s = service->RestoreFromCheckpoint();
    if (!s.ok()) return s;
    if (config.checkpoint().every_steps() > 0) {
      ShardService* raw = service.get();
      service->ckpt_thread_ = std::thread([raw] { raw->CheckpointLoop(); });
    }
  }
  return service;
}

uint64_t ShardService::MemoryBudgetBytes(const proto::LimitsConfig& limits) {
  if (limits.memory_budget_bytes() != 0) return limits.memory_budget_bytes();
  return AvailableMemoryBytes() / 10 * 8;
}

ShardService::ShardService(proto::ClusterConfig config, const ShardOptions& options)
    : config_(std::move(config)),
      options_(options),
      shard_map_(config_.shards_size(), config_.shard_map_epoch()),
      downlink_(cluster::DownlinkCodec(config_)),
      pool_(std::make_unique<ThreadPool>(options.decode_threads)),
      admission_(std::make_unique<Admission>(
          AdmissionLimits{MemoryBudgetBytes(config_.limits()), config_.limits().max_pending_steps(),
                          config_.limits().max_pending_bytes()})),
      metrics_(std::make_unique<ShardMetrics>(config_.job(), options.shard)),
      worker_names_(config_.workers()) {
  for (uint32_t w = 0; w < config_.workers(); ++w) worker_names_[w] = absl::StrCat("worker-", w);
  metrics_->SetTensors(0, 0, config_.shard_map_epoch());
  metrics_->SetAdmission(admission_->usage(), admission_->limits().memory_budget_bytes);
  log::Info("shard {}: memory budget {} bytes{}, at most {} tensors, {} pending steps", options_.shard,
            admission_->limits().memory_budget_bytes,
            config_.limits().memory_budget_bytes() == 0 ? " (80% of the memory available)" : "",
            config_.limits().max_tensors(), config_.limits().max_pending_steps());
}

absl::Status ShardService::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("tensor key must not be empty");
  if (key.size() > config_.limits().max_key_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor key of ", key.size(),
                                                   " bytes exceeds limits.max_key_bytes = ",
                                                   config_.limits().max_key_bytes()));
  }
  return absl::OkStatus();
}

uint64_t ShardService::OwnerTableBytes(const std::string& key, const cluster::ChunkLayout& layout) {
  return kTensorOverheadBytes + key.size() + uint64_t{layout.num_chunks} * sizeof(uint32_t);
}

uint64_t ShardService::OwnedChunkBytes(const cluster::ChunkLayout& layout, codec::DType dtype,
                                       const cluster::OptimizerOptions& optimizer,
                                       uint32_t chunk) const {
  const uint64_t n = layout.size(chunk);
  return kChunkOverheadBytes + uint64_t{config_.workers()} * 32 +
         n * cluster::Optimizer::StateBytesPerElement(optimizer.kind) +
         cluster::MaxWireBytes(n, dtype);
}

ShardService::~ShardService() {
  Shutdown();
  {
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_stop_ = true;
  }
  if (ckpt_thread_.joinable()) ckpt_thread_.join();
}

std::string ShardService::WorkerName(uint32_t worker) const {
  absl::MutexLock lock(&names_mu_);
  return worker < worker_names_.size() ? worker_names_[worker] : absl::StrCat("worker-", worker);
}

absl::Status ShardService::RegisterWorker(const proto::RegisterWorkerRequest& r,
                                          proto::RegisterWorkerResponse* response) {
  if (absl::Status s = CheckJobAndEpoch(r.job(), r.shard_map_epoch()); !s.ok()) return s;
  if (r.worker() >= config_.workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", r.worker(), " out of range: job has ",
                                                   config_.workers(), " workers"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
  }
  if (r.name().size() > config_.limits().max_key_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("worker name of ", r.name().size(),
                                                   " bytes exceeds limits.max_key_bytes = ",
                                                   config_.limits().max_key_bytes()));
  }
  if (!r.name().empty()) {
    absl::MutexLock lock(&names_mu_);
    worker_names_[r.worker()] = r.name();
  }
  log::Info("shard {}: worker {} registered as '{}'", options_.shard, r.worker(), r.name());
  response->set_shard(options_.shard);
  response->set_workers(config_.workers());
  return absl::OkStatus();
}

absl::Status ShardService::DeclareTensor(const proto::DeclareTensorRequest& r,
                                         proto::DeclareTensorResponse* response) {
  if (absl::Status s = CheckJobAndEpoch(r.job(), r.shard_map_epoch()); !s.ok()) return s;
  absl::Status key_ok = CheckKey(r.key());
  if (!key_ok.ok()) return key_ok;
  absl::StatusOr<codec::DType> dtype = cluster::FromProto(r.dtype());
  if (!dtype.ok()) return dtype.status();
  if (r.elements() == 0 || r.elements() > (uint64_t{1} << 36)) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", r.key(), "': elements must be in [1, 2^36], got ",
                                                   r.elements()));
  }
  absl::StatusOr<cluster::OptimizerOptions> opt =
      OptimizerFrom(r.has_optimizer() ? r.optimizer() : config_.optimizer());
  if (!opt.ok()) return opt.status();
  const cluster::ChunkLayout layout(r.elements(), codec::DTypeBytes(*dtype), config_.chunk_bytes());
  // Initial values are checked before anything is created, so a bad one leaves no trace.
  for (const proto::ChunkValue& init : r.initial()) {
    if (init.chunk() >= layout.num_chunks) {
      return absl::InvalidArgumentError(absl::StrCat("initial value for chunk ", init.chunk(),
                                                     " of '", r.key(), "' which has ",
                                                     layout.num_chunks, " chunks"));
    }
    const size_t bytes = layout.size(init.chunk()) * codec::DTypeBytes(*dtype);
    if (init.data().size() != bytes) {
      return absl::InvalidArgumentError(absl::StrCat("initial value for chunk ", init.chunk(),
                                                     " has ", init.data().size(),
                                                     " bytes, expected ", bytes));
    }
  }

  Tensor* tensor = nullptr;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
    auto it = tensors_.find(r.key());
    if (it != tensors_.end()) {
      Tensor* t = it->second.get();
      if (t->dtype != *dtype || t->layout.elements != r.elements() ||
          !SameOptimizer(t->optimizer, *opt)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "tensor '", r.key(), "' already declared as ", codec::DTypeName(t->dtype), " x ",
            t->layout.elements, " with a possibly different optimizer"));
      }
      tensor = t;
    } else {
      if (tensors_.size() >= config_.limits().max_tensors()) {
        admission_->CountRefusal();
        return absl::ResourceExhaustedError(absl::StrCat(
            "job '", config_.job(), "' already declares ", tensors_.size(),
            " tensors (limits.max_tensors = ", config_.limits().max_tensors(), "); '", r.key(),
            "' refused"));
      }
      // The owner table first (it is what Assign allocates), then the owned chunks' state:
      // both reserved before anything is allocated.
      const uint64_t table_bytes = OwnerTableBytes(r.key(), layout);
      absl::Status reserved = admission_->ReserveMemory(
          table_bytes, absl::StrCat("declaring '", r.key(), "' (", layout.num_chunks,
                                    " chunks, owner table)"));
      if (!reserved.ok()) return reserved;
      std::vector<uint32_t> owner = shard_map_.Assign(r.key(), layout);
      uint64_t owned_bytes = 0;
      uint32_t owned = 0;
      for (uint32_t c = 0; c < layout.num_chunks; ++c) {
        if (owner[c] != options_.shard) continue;
        owned_bytes += OwnedChunkBytes(layout, *dtype, *opt, c);
        ++owned;
      }
      reserved = admission_->ReserveMemory(
          owned_bytes, absl::StrCat("declaring '", r.key(), "' (", codec::DTypeName(*dtype), " x ",
                                    r.elements(), ", ", owned, " chunks owned here)"));
      if (!reserved.ok()) {
        admission_->ReleaseMemory(table_bytes);
        return reserved;
      }
      auto t = std::make_unique<Tensor>();
      t->key = r.key();
      t->dtype = *dtype;
      t->layout = layout;
      t->optimizer = *opt;
      t->optimizer_config = r.has_optimizer() ? r.optimizer() : config_.optimizer();
      t->owner = std::move(owner);
      for (uint32_t c = 0; c < layout.num_chunks; ++c) {
        if (t->owner[c] != options_.shard) continue;
        StepAccumulatorOptions ao;
        ao.workers = config_.workers();
        ao.step_timeout = absl::Milliseconds(config_.step_timeout_ms());
        ao.label = absl::StrCat("key '", r.key(), "' chunk ", c);
        ao.admission = admission_.get();
        ShardMetrics* metrics = metrics_.get();
        const uint64_t raw_bytes = layout.size(c) * codec::DTypeBytes(*dtype);
        ao.on_step_completed = [metrics, raw_bytes](const StepTimings& t) {
          metrics->ObserveStep(t, raw_bytes);
        };
        ao.on_step_failed = [metrics] { metrics->CountStepFailed(); };
        if (!config_.checkpoint().dir().empty() && config_.checkpoint().every_steps() > 0) {
          ao.snapshot_every_steps = config_.checkpoint().every_steps();
          ao.on_snapshot = [this, key = r.key(), c](ChunkSnapshot snap) {
            OnSnapshot(key, c, std::move(snap));
          };
        }
        const codec::DType dt = *dtype;
        const std::string key = r.key();
        const std::string job = config_.job();
        const uint64_t epoch = config_.shard_map_epoch();
        const cluster::DirectionCodec downlink = downlink_;
        auto finalize = [dt, key, job, epoch, c, downlink](int64_t step, absl::Span<const float> v)
            -> absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> {
          auto block = std::make_shared<proto::CompressedBlock>();
          proto::BlockAddress* a = block->mutable_address();
          a->set_job(job);
          a->set_key(key);
          a->set_chunk(c);
          a->set_step(step);
          a->set_shard_map_epoch(epoch);
          absl::Status s;
          if (dt == codec::DType::kF32) {
            s = cluster::EncodeWireBlock(downlink, dt, v.data(), v.size(), block.get());
          } else {
            std::vector<uint16_t> narrow(v.size());
            codec::FromF32(dt, v.data(), v.size(), narrow.data());
            s = cluster::EncodeWireBlock(downlink, dt, narrow.data(), v.size(), block.get());
          }
          if (!s.ok()) return s;
          return std::shared_ptr<const proto::CompressedBlock>(std::move(block));
        };
        t->chunks[c] = std::make_unique<StepAccumulator>(
            ao, cluster::Optimizer(*opt, layout.size(c)), std::move(finalize),
            [this](uint32_t w) { return WorkerName(w); });
      }
      log::Info("shard {}: declared '{}' {} x {} in {} chunks, {} owned here", options_.shard,
                r.key(), std::string(codec::DTypeName(*dtype)), r.elements(), layout.num_chunks,
                t->chunks.size());
      tensor = t.get();
      chunks_owned_ += t->chunks.size();
      tensors_[r.key()] = std::move(t);
      metrics_->SetTensors(tensors_.size(), chunks_owned_, config_.shard_map_epoch());
    }
  }
  // Initial values (parameters for an optimizer); chunks not owned here are ignored.
  for (const proto::ChunkValue& init : r.initial()) {
    auto it = tensor->chunks.find(init.chunk());
    if (it == tensor->chunks.end()) continue;
    std::vector<float> value(it->second->elements());
    codec::ToF32(tensor->dtype, init.data().data(), value.size(), value.data());
    it->second->SetInitial(value);
  }
  for (const auto& [c, acc] : tensor->chunks) response->add_owned_chunks(c);
  return absl::OkStatus();
}

absl::Status ShardService::CheckJobAndEpoch(const std::string& job, uint64_t epoch) const {
  if (job != config_.job()) {
    return absl::NotFoundError(absl::StrCat("unknown job '", job, "' (shard serves job '",
                                            config_.job(), "')"));
  }
  if (epoch != config_.shard_map_epoch()) {
    return absl::FailedPreconditionError(absl::StrCat("shard-map epoch ", epoch,
                                                      " does not match the shard's epoch ",
                                                      config_.shard_map_epoch()));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepAccumulator*> ShardService::OwnedChunk(const Tensor& t, const std::string& key,
                                                          uint32_t chunk) const {
  if (chunk >= t.layout.num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " out of range: '", key,
                                                   "' has ", t.layout.num_chunks, " chunks"));
  }
  auto it = t.chunks.find(chunk);
  if (it == t.chunks.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chunk ", chunk, " of '", key, "' is owned by shard ", t.owner[chunk],
        " under shard-map epoch ", config_.shard_map_epoch(), ", not shard ", options_.shard));
  }
  return it->second.get();
}

absl::StatusOr<ShardService::Tensor*> ShardService::FindTensor(const std::string& job,
                                                               uint64_t epoch,
                                                               const std::string& key) const {
  if (absl::Status s = CheckJobAndEpoch(job, epoch); !s.ok()) return s;
  absl::Status key_ok = CheckKey(key);
  if (!key_ok.ok()) return key_ok;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("shard shutting down");
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown tensor key '", key, "' (not declared)"));
  }
  return it->second.get();
}

absl::Status ShardService::PushPull(const proto::CompressedBlock& request, absl::Time deadline,
                                    proto::CompressedBlock* response) {
  absl::Status s = PushPullImpl(request, deadline, response);
  metrics_->CountPush(s.code());
  metrics_->SetAdmission(admission_->usage(), admission_->limits().memory_budget_bytes);
  if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded &&
      s.code() != absl::StatusCode::kUnavailable) {
    ++rejected_pushes_;
    {
      // Statuses name keys, chunks and workers, never the job token (it is checked in
      // the gRPC layer and never reaches here).
      absl::MutexLock lock(&last_error_mu_);
      last_error_ = TruncateUtf8(s.ToString(), kMaxLastErrorChars);
    }
    log::Warn("shard {}: rejected push of '{}' chunk {} step {} from worker {}: {}",
              options_.shard, request.address().key(), request.address().chunk(),
              request.address().step(), request.address().worker(), s.ToString());
  }
  return s;
}

absl::Status ShardService::PushPullImpl(const proto::CompressedBlock& request, absl::Time deadline,
                                        proto::CompressedBlock* response) {
  const proto::BlockAddress& a = request.address();
  absl::StatusOr<Tensor*> found = FindTensor(a.job(), a.shard_map_epoch(), a.key());
  if (!found.ok()) return found.status();
  Tensor* t = *found;
  if (a.worker() >= config_.workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", a.worker(), " out of range: job has ",
                                                   config_.workers(), " workers"));
  }
  if (a.step() < 0 || a.step() >= kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("step ", a.step(), " out of range [0, 2^62)"));
  }
  absl::StatusOr<StepAccumulator*> owned = OwnedChunk(*t, a.key(), a.chunk());
  if (!owned.ok()) return owned.status();
  StepAccumulator* acc = *owned;
  const size_t n = t->layout.size(a.chunk());
  if (request.dtype() != cluster::ToProto(t->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("block dtype ", proto::DType_Name(request.dtype()),
                                                   " does not match '", a.key(), "' (",
                                                   codec::DTypeName(t->dtype), ")"));
  }
  if (request.elements() != n) {
    return absl::InvalidArgumentError(absl::StrCat("block holds ", request.elements(),
                                                   " elements; chunk ", a.chunk(), " of '",
                                                   a.key(), "' has ", n));
  }
  if (request.data().size() > cluster::MaxWireBytes(n, t->dtype)) {
    return absl::ResourceExhaustedError(absl::StrCat("block of ", request.data().size(),
                                                     " bytes exceeds the bound ",
                                                     cluster::MaxWireBytes(n, t->dtype), " for ", n,
                                                     " elements"));
  }
  absl::StatusOr<bool> duplicate = acc->Admit(a.worker(), a.step());
  if (!duplicate.ok()) return duplicate.status();
  std::vector<float> contribution;
  if (!*duplicate) {
    absl::Status decoded;
    absl::Notification done;
    absl::StatusOr<std::vector<float>> buffer = acc->TakeBuffer();
    if (!buffer.ok()) return buffer.status();
    contribution = *std::move(buffer);
    absl::Duration decode_time;
    pool_->Schedule([&] {
      const absl::Time start = absl::Now();
      if (t->dtype == codec::DType::kF32) {
        decoded = cluster::DecodeWireBlock(request, t->dtype, n, contribution.data());
      } else {
        std::vector<uint16_t> narrow(n);
        decoded = cluster::DecodeWireBlock(request, t->dtype, n, narrow.data());
        if (decoded.ok()) codec::ToF32(t->dtype, narrow.data(), n, contribution.data());
      }
      decode_time = absl::Now() - start;
      done.Notify();
    });
    done.WaitForNotification();
    metrics_->ObserveDecode(n * codec::DTypeBytes(t->dtype), absl::ToDoubleSeconds(decode_time));
    if (!decoded.ok()) {
      acc->GiveBack(std::move(contribution));
      return decoded;
    }
  }
  ++pushes_;
  bytes_in_ += request.data().size();
  raw_bytes_in_ += n * codec::DTypeBytes(t->dtype);
  metrics_->AddIn(n * codec::DTypeBytes(t->dtype), request.data().size());
  absl::StatusOr<StepAccumulator::Outcome> outcome =
      acc->Push(a.worker(), a.step(), std::move(contribution), deadline);
  if (!outcome.ok()) return outcome.status();
  if (outcome->duplicate) {
    ++duplicate_pushes_;
    metrics_->CountDuplicate();
  }
  *response = *outcome->reply;
  response->mutable_address()->set_worker(a.worker());
  bytes_out_ += response->data().size();
  metrics_->AddOut(n * codec::DTypeBytes(t->dtype), response->data().size());
  raw_bytes_out_ += n * codec::DTypeBytes(t->dtype);
  return absl::OkStatus();
}

absl::Status ShardService::Pull(const proto::PullRequest& r, proto::CompressedBlock* response) {
  absl::StatusOr<Tensor*> found = FindTensor(r.job(), r.shard_map_epoch(), r.key());
  if (!found.ok()) return found.status();
  Tensor* t = *found;
  absl::StatusOr<StepAccumulator*> owned = OwnedChunk(*t, r.key(), r.chunk());
  if (!owned.ok()) return owned.status();
  absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> current = (*owned)->Current();
  if (!current.ok()) return current.status();
  *response = **current;
  bytes_out_ += response->data().size();
  metrics_->AddOut(response->elements() * codec::DTypeBytes(t->dtype), response->data().size());
  raw_bytes_out_ += t->layout.size(r.chunk()) * codec::DTypeBytes(t->dtype);
  return absl::OkStatus();
}

void ShardService::Stats(proto::StatsResponse* r) const {
  r->set_shard(options_.shard);
  r->set_pushes(pushes_);
  r->set_duplicate_pushes(duplicate_pushes_);
  r->set_rejected_pushes(rejected_pushes_);
  r->set_bytes_in(bytes_in_);
  r->set_bytes_out(bytes_out_);
  r->set_raw_bytes_in(raw_bytes_in_);
  r->set_raw_bytes_out(raw_bytes_out_);
  r->set_shard_map_epoch(config_.shard_map_epoch());
  r->set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - started_));
  {
    absl::MutexLock lock(&last_error_mu_);
    r->set_last_error(last_error_);
  }
  absl::MutexLock lock(&mu_);
  uint64_t done = 0, failed = 0, chunks_owned = 0;
  for (const auto& [key, t] : tensors_) {
    chunks_owned += t->chunks.size();
    for (const auto& [c, acc] : t->chunks) {
      done += acc->steps_completed();
      failed += acc->steps_failed();
    }
  }
  r->set_chunks_owned(chunks_owned);
  r->set_steps_completed(done);
  r->set_steps_failed(failed);
  r->set_tensors(tensors_.size());
  const AdmissionUsage usage = admission_->usage();
  r->set_memory_budget_bytes(admission_->limits().memory_budget_bytes);
  r->set_memory_used_bytes(usage.memory_bytes);
  r->set_pending_steps(usage.pending_steps);
  r->set_pending_bytes(usage.pending_bytes);
  r->set_refused_by_limits(usage.refused);
}

void ShardService::Shutdown() {
  std::vector<StepAccumulator*> chunks;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (const auto& [key, t] : tensors_) {
      for (const auto& [c, acc] : t->chunks) chunks.push_back(acc.get());
    }
  }
  // Outside mu_: accumulators take their own locks (tensors are never removed).
  for (StepAccumulator* acc : chunks) acc->Cancel(absl::UnavailableError("shard shutting down"));
}

namespace {

uint64_t SnapshotBytes(const ChunkSnapshot& s) {
  return (s.optimizer.value.size() + s.optimizer.m.size() + s.optimizer.v.size()) * sizeof(float);
}

}  // namespace

void ShardService::OnSnapshot(const std::string& key, uint32_t chunk, ChunkSnapshot snap) {
  const int64_t step = snap.completed_step;
  const uint64_t bytes = SnapshotBytes(snap);
  // The copies count against the memory budget until written; a step whose snapshots do
  // not fit is skipped (logged), and training goes on.
  absl::Status reserved = admission_->ReserveMemory(
      bytes, absl::StrCat("checkpoint of step ", step, " ('", key, "' chunk ", chunk, ")"));
  absl::MutexLock lock(&ckpt_mu_);
  PendingCheckpoint& p = pending_ckpt_[step];
  if (!reserved.ok()) {
    if (!p.refused) log::Warn("shard {}: skipping the checkpoint of step {}: {}", options_.shard, step, std::string(reserved.message()));
    p.refused = true;
  } else {
    p.reserved_bytes += bytes;
  }
  p.chunks.emplace_back(std::make_pair(key, chunk), reserved.ok() ? std::move(snap) : ChunkSnapshot{});
  if (p.chunks.size() >= chunks_owned_.load()) {
    ready_ckpt_.emplace_back(step, std::move(p));
    pending_ckpt_.erase(step);
  }
}

void ShardService::CheckpointLoop() {
  while (true) {
    std::pair<int64_t, PendingCheckpoint> job;
    {
      absl::MutexLock lock(&ckpt_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ckpt_mu_) {
        return ckpt_stop_ || !ready_ckpt_.empty();
      };
      ckpt_mu_.Await(absl::Condition(&ready));
      if (ready_ckpt_.empty()) return;
      job = std::move(ready_ckpt_.front());
      ready_ckpt_.pop_front();
      ckpt_writing_ = true;
    }
    if (!job.second.refused) {
      absl::Status s = WriteCheckpoint(false, job.first, std::move(job.second.chunks));
      if (!s.ok()) log::Error("shard {}: checkpoint of step {} failed: {}", options_.shard, job.first, s.ToString());
    }
    admission_->ReleaseMemory(job.second.reserved_bytes);
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_writing_ = false;
  }
}

void ShardService::FlushCheckpoints() {
  absl::MutexLock lock(&ckpt_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ckpt_mu_) {
    return ckpt_stop_ || (ready_ckpt_.empty() && !ckpt_writing_);
  };
  ckpt_mu_.Await(absl::Condition(&idle));
}

absl::Status ShardService::WriteCheckpoint(
    bool final, int64_t step,
    std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> chunks) {
  const absl::Time start = absl::Now();
  ShardCheckpoint c;
  c.job = config_.job();
  c.final = final;
  c.step = step;
  c.shard = options_.shard;
  c.shards = config_.shards_size();
  c.shard_map_epoch = config_.shard_map_epoch();
  absl::flat_hash_map<std::string, size_t> chunk_elements;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, t] : tensors_) {
      proto::TensorDeclaration& d = c.declarations.emplace_back();
      d.set_job(config_.job());
      d.set_key(key);
      d.set_dtype(cluster::ToProto(t->dtype));
      d.set_elements(t->layout.elements);
      d.set_chunk_bytes(config_.chunk_bytes());
      *d.mutable_optimizer() = t->optimizer_config;
    }
    for (auto& [id, snap] : chunks) {
      auto it = tensors_.find(id.first);
      if (it == tensors_.end()) return absl::InternalError("snapshot of an undeclared tensor");
      chunk_elements[absl::StrCat(id.first, "\n", id.second)] = it->second->layout.size(id.second);
    }
  }
  std::sort(c.declarations.begin(), c.declarations.end(),
            [](const auto& a, const auto& b) { return a.key() < b.key(); });
  for (auto& [id, snap] : chunks) {
    if (final) c.step = std::max(c.step, snap.completed_step);
    absl::Status s = ChunkStateToProto(config_.job(), id.first, id.second,
                                       chunk_elements[absl::StrCat(id.first, "\n", id.second)], snap,
                                       &c.chunks.emplace_back());
    if (!s.ok()) return s;
    snap = ChunkSnapshot{};  // free the copy early
  }
  const std::string set_name = CheckpointSetName(final, c.step, c.shards);
  const size_t chunk_count = c.chunks.size();
  absl::StatusOr<uint64_t> bytes =
      WriteShardCheckpoint(config_.checkpoint().dir(), std::move(c), config_.checkpoint().keep());
  if (!bytes.ok()) return bytes.status();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  log::Info("shard {}: checkpoint {} written: {} chunks, {} bytes in {:.3f} s", options_.shard,
            set_name, chunk_count, *bytes, seconds);
  metrics_->ObserveCheckpoint(*bytes, seconds);
  return absl::OkStatus();
}

absl::Status ShardService::WriteFinalCheckpoint() {
  if (config_.checkpoint().dir().empty()) {
    return absl::FailedPreconditionError("no checkpoint.dir configured");
  }
  {
    absl::MutexLock lock(&ckpt_mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ckpt_mu_) {
      return ready_ckpt_.empty() && !ckpt_writing_;
    };
    if (ckpt_thread_.joinable()) ckpt_mu_.Await(absl::Condition(&idle));
  }
  std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> chunks;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, t] : tensors_) {
      for (const auto& [c, acc] : t->chunks) chunks.emplace_back(std::make_pair(key, c), acc->Snapshot());
    }
  }
  return WriteCheckpoint(true, -1, std::move(chunks));
}

absl::Status ShardService::RestoreFromCheckpoint() {
  const std::string& dir = config_.checkpoint().dir();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(dir);
  if (absl::IsNotFound(loaded.status())) {
    log::Info("shard {}: no checkpoint in {}; starting empty", options_.shard, dir);
    return absl::OkStatus();
  }
  if (!loaded.ok()) return loaded.status();
  const absl::Time start = absl::Now();
  if (loaded->job != config_.job()) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", loaded->path, " is of job '",
                                                      loaded->job, "', not '", config_.job(), "'"));
  }
  absl::flat_hash_map<std::string, const proto::TensorDeclaration*> decls;
  for (const proto::TensorDeclaration& d : loaded->declarations) {
    if (d.chunk_bytes() != config_.chunk_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", loaded->path, ": '", d.key(), "' was cut into chunks of ", d.chunk_bytes(),
          " bytes; the config says chunk_bytes ", config_.chunk_bytes()));
    }
    proto::DeclareTensorRequest r;
    r.set_job(d.job());
    r.set_key(d.key());
    r.set_dtype(d.dtype());
    r.set_elements(d.elements());
    *r.mutable_optimizer() = d.optimizer();
    r.set_shard_map_epoch(config_.shard_map_epoch());
    proto::DeclareTensorResponse response;
    absl::Status s = DeclareTensor(r, &response);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring checkpoint ", loaded->path, ": ", s.message()));
    }
    decls[d.key()] = &d;
  }
  uint64_t restored = 0;
  for (const proto::ChunkState& st : loaded->chunks) {
    StepAccumulator* acc = nullptr;
    codec::DType dtype = codec::DType::kF32;
    {
      absl::MutexLock lock(&mu_);
      Tensor* t = tensors_.at(st.key()).get();
      auto it = t->chunks.find(st.chunk());
      if (it == t->chunks.end()) continue;  // owned by another shard under this config
      acc = it->second.get();
      dtype = t->dtype;
    }
    absl::StatusOr<ChunkSnapshot> snap = ChunkStateFromProto(st, acc->elements(), dtype);
    if (snap.ok() && snap->cached_result != nullptr) {
      // Replies carry the epoch they were sent under; a retry now gets this shard's.
      auto result = std::make_shared<proto::CompressedBlock>(*snap->cached_result);
      result->mutable_address()->set_shard_map_epoch(config_.shard_map_epoch());
      snap->cached_result = std::move(result);
    }
    absl::Status s = snap.ok() ? acc->Restore(*std::move(snap)) : snap.status();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring checkpoint ", loaded->path, ": ", s.message()));
    }
    ++restored;
  }
  restored_from_ = loaded->path;
  restored_step_ = loaded->step;
  log::Info("shard {}: restored {} chunks of {} tensors from {} (step {}, {} bytes read, {:.3f} s){}",
            options_.shard, restored, loaded->declarations.size(), loaded->path, loaded->step,
            loaded->bytes, absl::ToDoubleSeconds(absl::Now() - start),
            loaded->skipped.empty() ? "" : absl::StrCat("; skipped newer: ", loaded->skipped.size()));
  return absl::OkStatus();
}

}  // namespace gcomp::server
