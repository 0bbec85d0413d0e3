#include "server/shard_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/logging.h"
#include "base/system_memory.h"
#include "cluster/wire_block.h"
#include "server/checkpoint.h"
#include "server/chunk_state.h"
#include "server/shard_tensor.h"

namespace gcomp::server {

namespace {


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
      self_address_(config_.shards(options.shard)),
      downlink_(cluster::DownlinkCodec(config_)),
      pool_(std::make_unique<ThreadPool>(options.decode_threads)),
      admission_(std::make_unique<Admission>(
          AdmissionLimits{MemoryBudgetBytes(config_.limits()), config_.limits().max_pending_steps(),
                          config_.limits().max_pending_bytes()})),
      metrics_(std::make_unique<ShardMetrics>(config_.job(), options.shard)),
      map_config_(config_),
      shard_map_(config_.shards_size(), config_.shard_map_epoch()),
      epoch_(config_.shard_map_epoch()),
      shard_index_(options.shard),
      map_shards_(config_.shards_size()),
      replicas_(cluster::Replicas(config_)),
      down_(config_.shards_size(), false),
      joining_shards_(config_.shards_size(), false),
      worker_names_(config_.workers()) {
  for (uint32_t k : config_.down_shards()) down_[k] = true;
  for (uint32_t k : config_.joining_shards()) joining_shards_[k] = true;
  for (uint32_t w = 0; w < config_.workers(); ++w) worker_names_[w] = absl::StrCat("worker-", w);
  metrics_->SetTensors(0, 0, config_.shard_map_epoch());
  metrics_->SetAdmission(admission_->usage(), admission_->limits().memory_budget_bytes);
  log::Info("shard {}: memory budget {} bytes{}, at most {} tensors, {} pending steps", shard(),
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

uint64_t ShardService::OwnerTableBytes(const std::string& key, const cluster::ChunkLayout& layout,
                                       uint32_t replicas) {
  return kTensorOverheadBytes + key.size() +
         uint64_t{layout.num_chunks} * sizeof(uint32_t) * (1 + replicas);
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
  if (switch_thread_.joinable()) switch_thread_.join();
  if (rejoin_thread_.joinable()) rejoin_thread_.join();
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
                                          proto::RegisterWorkerResponse* response,
                                          absl::Time deadline) {
  if (absl::Status s = CheckJobAndEpoch(r.job(), r.shard_map_epoch(), deadline); !s.ok()) return s;
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
  log::Info("shard {}: worker {} registered as '{}'", shard(), r.worker(), r.name());
  response->set_shard(shard());
  response->set_workers(config_.workers());
  return absl::OkStatus();
}

absl::Status ShardService::DeclareTensor(const proto::DeclareTensorRequest& r,
                                         proto::DeclareTensorResponse* response,
                                         absl::Time deadline) {
  if (absl::Status s = CheckJobAndEpoch(r.job(), r.shard_map_epoch(), deadline); !s.ok()) return s;
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

  std::vector<std::pair<std::shared_ptr<StepAccumulator>, const proto::ChunkValue*>> initial;
  codec::DType tensor_dtype;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
    absl::StatusOr<Tensor*> tensor = DeclareLocked(r, *dtype, *opt, /*fresh=*/true);
    if (!tensor.ok()) return tensor.status();
    tensor_dtype = (*tensor)->dtype;
    for (const proto::ChunkValue& init : r.initial()) {
      auto it = (*tensor)->chunks.find(init.chunk());
      if (it != (*tensor)->chunks.end()) initial.emplace_back(it->second, &init);
      // A backup keeps the initial value until the owner replicates a state.
      auto b = (*tensor)->backups.find(init.chunk());
      if (b != (*tensor)->backups.end() && !b->second.has_state) {
        b->second.initial.resize((*tensor)->layout.size(init.chunk()));
        codec::ToF32(tensor_dtype, init.data().data(), b->second.initial.size(),
                     b->second.initial.data());
      }
    }
    for (const auto& [c, acc] : (*tensor)->chunks) response->add_owned_chunks(c);
  }
  // Initial values (parameters for an optimizer); chunks not owned here are ignored.
  for (const auto& [acc, init] : initial) {
    std::vector<float> value(acc->elements());
    codec::ToF32(tensor_dtype, init->data().data(), value.size(), value.data());
    acc->SetInitial(value);
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardService::Tensor*> ShardService::DeclareLocked(
    const proto::DeclareTensorRequest& r, codec::DType dtype, const cluster::OptimizerOptions& opt,
    bool fresh) {
  const cluster::ChunkLayout layout(r.elements(), codec::DTypeBytes(dtype), config_.chunk_bytes());
  auto it = tensors_.find(r.key());
  if (it != tensors_.end()) {
    Tensor* t = it->second.get();
    if (t->dtype != dtype || t->layout.elements != r.elements() || !SameOptimizer(t->optimizer, opt)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "tensor '", r.key(), "' already declared as ", codec::DTypeName(t->dtype), " x ",
          t->layout.elements, " with a possibly different optimizer"));
    }
    return t;
  }
  if (tensors_.size() >= config_.limits().max_tensors()) {
    admission_->CountRefusal();
    return absl::ResourceExhaustedError(absl::StrCat(
        "job '", config_.job(), "' already declares ", tensors_.size(),
        " tensors (limits.max_tensors = ", config_.limits().max_tensors(), "); '", r.key(),
        "' refused"));
  }
  // The owner table first (it is what Assign allocates), then the owned chunks' state:
  // both reserved before anything is allocated.
  const uint64_t table_bytes = OwnerTableBytes(r.key(), layout, replicas_);
  absl::Status reserved = admission_->ReserveMemory(
      table_bytes, absl::StrCat("declaring '", r.key(), "' (", layout.num_chunks,
                                " chunks, owner table)"));
  if (!reserved.ok()) return reserved;
  std::vector<uint32_t> live =
      shard_map_.LiveReplicas(r.key(), layout, replicas_, down_, joining_shards_);
  const uint32_t self = shard_index_.load();
  uint64_t owned_bytes = 0;
  uint32_t owned = 0;
  // Owned and backed-up chunks alike: a backup's state is as large as its owner's.
  for (uint32_t c = 0; c < layout.num_chunks; ++c) {
    if (std::find(&live[c * replicas_], &live[(c + 1) * replicas_], self) ==
        &live[(c + 1) * replicas_]) {
      continue;
    }
    owned_bytes += OwnedChunkBytes(layout, dtype, opt, c);
    ++owned;
  }
  reserved = admission_->ReserveMemory(
      owned_bytes, absl::StrCat("declaring '", r.key(), "' (", codec::DTypeName(dtype), " x ",
                                r.elements(), ", ", owned, " chunks owned here)"));
  if (!reserved.ok()) {
    admission_->ReleaseMemory(table_bytes);
    return reserved;
  }
  auto t = std::make_unique<Tensor>();
  t->key = r.key();
  t->dtype = dtype;
  t->layout = layout;
  t->optimizer = opt;
  t->optimizer_config = r.has_optimizer() ? r.optimizer() : config_.optimizer();
  t->live = std::move(live);
  t->owner.resize(layout.num_chunks);
  for (uint32_t c = 0; c < layout.num_chunks; ++c) {
    t->owner[c] = t->live[c * replicas_];
    if (t->owner[c] == self) t->chunks[c] = MakeAccumulator(*t, c);
    for (uint32_t j = 1; j < replicas_; ++j) {
      // A joining shard's backups are synced by their owners' states, never by a declaration.
      if (t->live[c * replicas_ + j] == self) t->backups[c].synced = fresh && !joining_shards_[self];
    }
  }
  log::Info("shard {}: declared '{}' {} x {} in {} chunks, {} owned here", self, r.key(),
            std::string(codec::DTypeName(dtype)), r.elements(), layout.num_chunks, t->chunks.size());
  Tensor* raw = t.get();
  chunks_owned_ += t->chunks.size();
  tensors_[r.key()] = std::move(t);
  metrics_->SetTensors(tensors_.size(), chunks_owned_, epoch_.load());
  return raw;
}

std::shared_ptr<StepAccumulator> ShardService::MakeAccumulator(const Tensor& t, uint32_t c) {
  StepAccumulatorOptions ao;
  ao.workers = config_.workers();
  ao.step_timeout = absl::Milliseconds(config_.step_timeout_ms());
  ao.label = absl::StrCat("key '", t.key, "' chunk ", c);
  ao.admission = admission_.get();
  ShardMetrics* metrics = metrics_.get();
  const uint64_t raw_bytes = t.layout.size(c) * codec::DTypeBytes(t.dtype);
  ao.on_step_completed = [metrics, raw_bytes](const StepTimings& timings) {
    metrics->ObserveStep(timings, raw_bytes);
  };
  ao.on_step_failed = [metrics] { metrics->CountStepFailed(); };
  if (!config_.checkpoint().dir().empty() && config_.checkpoint().every_steps() > 0) {
    ao.snapshot_every_steps = config_.checkpoint().every_steps();
    ao.on_snapshot = [this, key = t.key, c](ChunkSnapshot snap) {
      OnSnapshot(key, c, std::move(snap));
    };
  }
  if (replicas_ > 1) {
    ao.replicate = [this, key = t.key, c](const ChunkSnapshot& snap) {
      return ReplicateChunk(key, c, snap);
    };
  }
  const codec::DType dt = t.dtype;
  const std::string key = t.key;
  const std::string job = config_.job();
  const cluster::DirectionCodec downlink = downlink_;
  const std::atomic<uint64_t>* epoch = &epoch_;
  auto finalize = [dt, key, job, epoch, c, downlink](int64_t step, absl::Span<const float> v)
      -> absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> {
    auto block = std::make_shared<proto::CompressedBlock>();
    proto::BlockAddress* a = block->mutable_address();
    a->set_job(job);
    a->set_key(key);
    a->set_chunk(c);
    a->set_step(step);
    a->set_shard_map_epoch(epoch->load());
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
  return std::make_shared<StepAccumulator>(ao, cluster::Optimizer(t.optimizer, t.layout.size(c)),
                                           std::move(finalize),
                                           [this](uint32_t w) { return WorkerName(w); });
}

absl::Status ShardService::CheckJobAndEpoch(const std::string& job, uint64_t epoch,
                                            absl::Time deadline) const {
  if (job != config_.job()) {
    return absl::NotFoundError(absl::StrCat("unknown job '", job, "' (shard serves job '",
                                            config_.job(), "')"));
  }
  absl::MutexLock lock(&mu_);
  return CheckEpochLocked(epoch, deadline);
}

std::string ShardService::SupersededMessage(uint64_t epoch) const {
  const proto::ClusterConfig& now = phase_ == Phase::kCommitted ? next_config_ : map_config_;
  return absl::StrCat("shard-map epoch ", epoch, " was replaced by epoch ", now.shard_map_epoch(),
                      " (", now.shards_size(), " shards)",
                      switch_step_ >= 0 ? absl::StrCat(" from step ", switch_step_) : "",
                      "; fetch the new config from any shard and resend");
}

absl::Status ShardService::CheckEpochLocked(uint64_t epoch, absl::Time deadline) const {
  ExpirePrepareLocked();
  if (rejoining_) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", self_address_, " restarted and is rejoining the running job; retry"));
  }
  if (replicas_ > 1 && epoch > epoch_.load() && phase_ == Phase::kServing) {
    // A failover's map reaches the shards one after the other: a caller that learnt it
    // from another shard waits a little for it here.
    auto installed = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || epoch_.load() >= epoch || phase_ != Phase::kServing;
    };
    AwaitLocked(installed, std::min(deadline, absl::Now() + absl::Seconds(2)));
    if (epoch_.load() < epoch && !shutting_down_ && phase_ == Phase::kServing) {
      return absl::UnavailableError(absl::StrCat("shard-map epoch ", epoch,
                                                 " is not installed on this shard yet; retry"));
    }
  }
  const uint64_t current = epoch_.load();
  const bool switching = (phase_ == Phase::kPrepared || phase_ == Phase::kCommitted) &&
                         epoch == next_config_.shard_map_epoch();
  if (epoch == current && phase_ == Phase::kDrained) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this shard (", self_address_, ") is not in shard-map epoch ", epoch,
        "; a re-shard removed it"));
  }
  if (epoch == current && phase_ != Phase::kFilling && !joining_) return absl::OkStatus();
  if (epoch != current && !switching) {
    if (epoch != 0 && epoch <= left_epoch_) return absl::AbortedError(SupersededMessage(epoch));
    return absl::FailedPreconditionError(absl::StrCat("shard-map epoch ", epoch,
                                                      " does not match the shard's epoch ", current));
  }
  // A call of the new map before this shard serves it: wait for the switch and the moved
  // state.
  auto ready = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ExpirePrepareLocked();
    if (shutting_down_) return true;
    if (epoch_.load() == epoch) return phase_ != Phase::kFilling && !joining_;
    return phase_ == Phase::kServing;  // the re-shard was dropped
  };
  AwaitLocked(ready, deadline);
  if (shutting_down_) return absl::UnavailableError("shard shutting down");
  if (epoch_.load() != epoch) {
    if (phase_ == Phase::kServing) {
      return absl::FailedPreconditionError(absl::StrCat("shard-map epoch ", epoch,
                                                        " does not match the shard's epoch ",
                                                        epoch_.load(), " (the re-shard was dropped)"));
    }
    return absl::UnavailableError(absl::StrCat("shard is switching to shard-map epoch ", epoch,
                                               "; retry"));
  }
  if (phase_ == Phase::kFilling || joining_) {
    return absl::UnavailableError(absl::StrCat("shard is receiving moved chunks for shard-map epoch ",
                                               epoch, "; retry"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<StepAccumulator>> ShardService::OwnedChunk(
    const Tensor& t, const std::string& key, uint32_t chunk) const {
  if (chunk >= t.layout.num_chunks) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " out of range: '", key,
                                                   "' has ", t.layout.num_chunks, " chunks"));
  }
  absl::MutexLock lock(&mu_);
  auto it = t.chunks.find(chunk);
  if (auto lost = t.lost.find(chunk); lost != t.lost.end()) return absl::DataLossError(lost->second);
  if (it == t.chunks.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chunk ", chunk, " of '", key, "' is owned by shard ", t.owner[chunk],
        " under shard-map epoch ", epoch_.load(), ", not shard ", shard()));
  }
  return it->second;
}

absl::StatusOr<ShardService::Tensor*> ShardService::FindTensor(const std::string& job,
                                                               uint64_t epoch,
                                                               const std::string& key,
                                                               absl::Time deadline) const {
  if (absl::Status s = CheckJobAndEpoch(job, epoch, deadline); !s.ok()) return s;
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
      s.code() != absl::StatusCode::kUnavailable && s.code() != absl::StatusCode::kAborted) {
    ++rejected_pushes_;
    {
      // Statuses name keys, chunks and workers, never the job token (it is checked in
      // the gRPC layer and never reaches here).
      absl::MutexLock lock(&last_error_mu_);
      last_error_ = TruncateUtf8(s.ToString(), kMaxLastErrorChars);
    }
    log::Warn("shard {}: rejected push of '{}' chunk {} step {} from worker {}: {}",
              shard(), request.address().key(), request.address().chunk(),
              request.address().step(), request.address().worker(), s.ToString());
  }
  return s;
}

absl::Status ShardService::PushPullImpl(const proto::CompressedBlock& request, absl::Time deadline,
                                        proto::CompressedBlock* response) {
  const proto::BlockAddress& a = request.address();
  absl::StatusOr<Tensor*> found = FindTensor(a.job(), a.shard_map_epoch(), a.key(), deadline);
  if (!found.ok()) return found.status();
  Tensor* t = *found;
  if (a.worker() >= config_.workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", a.worker(), " out of range: job has ",
                                                   config_.workers(), " workers"));
  }
  if (a.step() < 0 || a.step() >= kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("step ", a.step(), " out of range [0, 2^62)"));
  }
  if (absl::Status frozen = WaitWhileFrozen(a.shard_map_epoch(), a.step(), deadline); !frozen.ok()) {
    return frozen;
  }
  absl::StatusOr<std::shared_ptr<StepAccumulator>> owned = OwnedChunk(*t, a.key(), a.chunk());
  if (!owned.ok()) return owned.status();
  StepAccumulator* acc = owned->get();
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

absl::Status ShardService::Pull(const proto::PullRequest& r, proto::CompressedBlock* response,
                                absl::Time deadline) {
  absl::StatusOr<Tensor*> found = FindTensor(r.job(), r.shard_map_epoch(), r.key(), deadline);
  if (!found.ok()) return found.status();
  Tensor* t = *found;
  absl::StatusOr<std::shared_ptr<StepAccumulator>> owned = OwnedChunk(*t, r.key(), r.chunk());
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
  r->set_shard(shard());
  r->set_pushes(pushes_);
  r->set_duplicate_pushes(duplicate_pushes_);
  r->set_rejected_pushes(rejected_pushes_);
  r->set_bytes_in(bytes_in_);
  r->set_bytes_out(bytes_out_);
  r->set_raw_bytes_in(raw_bytes_in_);
  r->set_raw_bytes_out(raw_bytes_out_);
  r->set_shard_map_epoch(epoch_.load());
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
  *r->mutable_down_shards() = map_config_.down_shards();
  r->set_replication_degraded(map_config_.down_shards_size() > 0);
  const AdmissionUsage usage = admission_->usage();
  r->set_memory_budget_bytes(admission_->limits().memory_budget_bytes);
  r->set_memory_used_bytes(usage.memory_bytes);
  r->set_pending_steps(usage.pending_steps);
  r->set_pending_bytes(usage.pending_bytes);
  r->set_refused_by_limits(usage.refused);
}

void ShardService::Shutdown() {
  std::vector<std::shared_ptr<StepAccumulator>> chunks;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (const auto& [key, t] : tensors_) {
      for (const auto& [c, acc] : t->chunks) chunks.push_back(acc);
    }
  }
  // Outside mu_: accumulators take their own locks.
  for (const auto& acc : chunks) acc->Cancel(absl::UnavailableError("shard shutting down"));
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
  auto [pending, inserted] = pending_ckpt_.try_emplace(step);
  PendingCheckpoint& p = pending->second;
  if (inserted) {
    // The map the step ran under: a re-shard may switch before the set is written.
    p.shard = shard();
    p.epoch = epoch_.load();
    p.shards = map_shards_.load();
  }
  if (!reserved.ok()) {
    if (!p.refused) log::Warn("shard {}: skipping the checkpoint of step {}: {}", shard(), step, std::string(reserved.message()));
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
      absl::Status s = WriteCheckpoint(false, job.first, job.second.shard, job.second.shards,
                                       job.second.epoch, std::move(job.second.chunks));
      if (!s.ok()) log::Error("shard {}: checkpoint of step {} failed: {}", shard(), job.first, s.ToString());
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
    bool final, int64_t step, uint32_t shard, uint32_t shards, uint64_t epoch,
    std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> chunks) {
  const absl::Time start = absl::Now();
  ShardCheckpoint c;
  c.job = config_.job();
  c.final = final;
  c.step = step;
  c.shard = shard;
  c.shards = shards;
  c.shard_map_epoch = epoch;
  absl::flat_hash_map<std::string, size_t> chunk_elements;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [key, t] : tensors_) {
      c.declarations.push_back(t->Declaration(config_));
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
  log::Info("shard {}: checkpoint {} written: {} chunks, {} bytes in {:.3f} s", shard,
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
  uint32_t shards = 0;
  {
    absl::MutexLock lock(&mu_);
    if (phase_ == Phase::kDrained) {
      log::Info("shard {}: removed by a re-shard; its chunks live on other shards, no final checkpoint",
                shard());
      return absl::OkStatus();
    }
    shards = map_config_.shards_size();
    for (const auto& [key, t] : tensors_) {
      for (const auto& [c, acc] : t->chunks) chunks.emplace_back(std::make_pair(key, c), acc->Snapshot());
    }
  }
  return WriteCheckpoint(true, -1, shard(), shards, epoch_.load(), std::move(chunks));
}

absl::Status ShardService::RestoreFromCheckpoint() {
  const std::string& dir = config_.checkpoint().dir();
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(dir);
  if (absl::IsNotFound(loaded.status())) {
    log::Info("shard {}: no checkpoint in {}; starting empty", shard(), dir);
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
    r.set_shard_map_epoch(epoch_.load());
    proto::DeclareTensorResponse response;
    absl::Status s = DeclareTensor(r, &response);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring checkpoint ", loaded->path, ": ", s.message()));
    }
    decls[d.key()] = &d;
  }
  uint64_t restored = 0;
  for (const proto::ChunkState& st : loaded->chunks) {
    std::shared_ptr<StepAccumulator> acc;
    codec::DType dtype = codec::DType::kF32;
    {
      absl::MutexLock lock(&mu_);
      Tensor* t = tensors_.at(st.key()).get();
      auto it = t->chunks.find(st.chunk());
      if (it == t->chunks.end()) continue;  // owned by another shard under this config
      acc = it->second;
      dtype = t->dtype;
    }
    absl::StatusOr<ChunkSnapshot> snap = ChunkStateFromProto(st, acc->elements(), dtype);
    if (snap.ok()) StampEpoch(epoch_.load(), &*snap);
    absl::Status s = snap.ok() ? acc->Restore(*std::move(snap)) : snap.status();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring checkpoint ", loaded->path, ": ", s.message()));
    }
    ++restored;
  }
  restored_from_ = loaded->path;
  restored_step_ = loaded->step;
  log::Info("shard {}: restored {} chunks of {} tensors from {} (step {}, {} bytes read, {:.3f} s){}",
            shard(), restored, loaded->declarations.size(), loaded->path, loaded->step,
            loaded->bytes, absl::ToDoubleSeconds(absl::Now() - start),
            loaded->skipped.empty() ? "" : absl::StrCat("; skipped newer: ", loaded->skipped.size()));
  return absl::OkStatus();
}


// ---- Re-sharding (docs/SERVICE.md, "Re-sharding") ----

namespace {

int IndexOf(const proto::ClusterConfig& config, const std::string& address) {
  for (int i = 0; i < config.shards_size(); ++i) {
    if (config.shards(i) == address) return i;
  }
  return -1;
}

constexpr uint32_t kDefaultPrepareTimeoutMs = 30000;
constexpr uint32_t kMaxPrepareTimeoutMs = 300000;
// As many shards as a config may list in practice; bounds what a Prepare can make a shard
// wait for.
constexpr uint32_t kMaxOldShards = 65536;

}  // namespace

bool ShardService::AwaitLocked(const std::function<bool()>& ready, absl::Time deadline) const {
  // A prepared re-shard expires without any call touching mu_, so waits wake at its
  // deadline to notice.
  while (!ready()) {
    const absl::Time until =
        phase_ == Phase::kPrepared ? std::min(deadline, prepare_deadline_) : deadline;
    auto cond = [&ready]() { return ready(); };
    if (mu_.AwaitWithDeadline(absl::Condition(&cond), until)) return true;
    if (absl::Now() >= deadline) return ready();
  }
  return true;
}

void ShardService::ExpirePrepareLocked() const {
  if (phase_ != Phase::kPrepared || absl::Now() < prepare_deadline_) return;
  log::Warn("shard {}: no commit of the re-shard to epoch {} within the prepare timeout; "
            "staying on epoch {}",
            shard(), next_config_.shard_map_epoch(), epoch_.load());
  phase_ = Phase::kServing;
  freeze_after_ = kMaxStep;
  joining_ = false;
}

absl::StatusOr<proto::PrepareReshardResponse> ShardService::PrepareReshard(
    const proto::PrepareReshardRequest& r) {
  const proto::ClusterConfig& next = r.next();
  absl::MutexLock lock(&mu_);
  ExpirePrepareLocked();
  if (shutting_down_) return absl::UnavailableError("shard shutting down");
  if (next.job() != config_.job()) {
    return absl::InvalidArgumentError(absl::StrCat("re-shard of job '", next.job(),
                                                   "' sent to a shard of job '", config_.job(), "'"));
  }
  const bool in_new = IndexOf(next, self_address_) >= 0;
  proto::PrepareReshardResponse response;
  response.set_in_new_map(in_new);
  if (phase_ == Phase::kPrepared || phase_ == Phase::kCommitted) {
    if (next_config_.shard_map_epoch() == next.shard_map_epoch()) {  // a retried Prepare
      response.set_in_old_map(!joining_);
      response.set_highest_step(joining_ ? -1 : freeze_after_);
      return response;
    }
    return absl::FailedPreconditionError(absl::StrCat("a re-shard to epoch ",
                                                      next_config_.shard_map_epoch(),
                                                      " is already under way"));
  }
  if (phase_ == Phase::kFilling) {
    return absl::FailedPreconditionError("still receiving the chunks of the last re-shard");
  }
  if (phase_ == Phase::kDrained) {
    return absl::FailedPreconditionError(absl::StrCat("this shard (", self_address_,
                                                      ") was removed by a re-shard"));
  }
  // A peer may not freeze the job for longer than kMaxPrepareTimeoutMs.
  const uint32_t timeout_ms = r.prepare_timeout_ms() != 0
                                  ? std::min(r.prepare_timeout_ms(), kMaxPrepareTimeoutMs)
                                  : kDefaultPrepareTimeoutMs;
  const absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
  if (epoch_.load() == next.shard_map_epoch()) {
    // Started with the new config: a shard the re-shard adds. It must be empty.
    if (!in_new) {
      return absl::InvalidArgumentError(absl::StrCat("this shard's address ", self_address_,
                                                     " is not in the new config"));
    }
    if (!tensors_.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", self_address_, " already serves epoch ", next.shard_map_epoch(),
          " with ", tensors_.size(), " tensors; a shard added by a re-shard must start empty"));
    }
    if (absl::Status s = cluster::ValidateClusterConfig(next); !s.ok()) return s;
    if (!std::equal(next.shards().begin(), next.shards().end(), map_config_.shards().begin(),
                    map_config_.shards().end())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the new config's shards differ from the ones this shard of epoch ",
          next.shard_map_epoch(), " was started with"));
    }
    if (r.old_shards() == 0 || r.old_shards() > kMaxOldShards) {
      return absl::InvalidArgumentError(absl::StrCat("old_shards must be in [1, ", kMaxOldShards,
                                                     "], got ", r.old_shards()));
    }
    next_config_ = next;
    joining_ = true;
    joining_old_shards_ = r.old_shards();
    phase_ = Phase::kPrepared;
    prepare_deadline_ = deadline;
    response.set_highest_step(-1);
    log::Info("shard {}: prepared to join epoch {} from {} old shards", shard(),
              next.shard_map_epoch(), r.old_shards());
    return response;
  }
  if (absl::Status s = cluster::ValidateReshard(map_config_, next); !s.ok()) return s;
  if (map_config_.down_shards_size() > 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", map_config_.down_shards(0), " is down (failed over); a re-shard needs every "
        "shard of the running map up"));
  }
  int64_t highest = -1;
  for (const auto& [key, t] : tensors_) {
    for (const auto& [c, acc] : t->chunks) {
      const StepProgress p = acc->Progress();
      if (p.started) highest = std::max(highest, p.current_step);
    }
  }
  next_config_ = next;
  phase_ = Phase::kPrepared;
  prepare_deadline_ = deadline;
  freeze_after_ = std::max(highest, r.at_step() - 1);
  response.set_in_old_map(true);
  response.set_highest_step(freeze_after_);
  log::Info("shard {}: prepared re-shard from epoch {} ({} shards) to epoch {} ({} shards); "
            "steps after {} wait",
            shard(), epoch_.load(), map_config_.shards_size(), next.shard_map_epoch(),
            next.shards_size(), freeze_after_);
  return response;
}

absl::Status ShardService::CommitReshard(uint64_t next_epoch, int64_t switch_step) {
  absl::MutexLock lock(&mu_);
  ExpirePrepareLocked();
  if (phase_ == Phase::kCommitted && next_config_.shard_map_epoch() == next_epoch) {
    return switch_step == switch_step_
               ? absl::OkStatus()
               : absl::FailedPreconditionError(absl::StrCat("re-shard to epoch ", next_epoch,
                                                            " already committed at step ", switch_step_));
  }
  if (phase_ != Phase::kPrepared || next_config_.shard_map_epoch() != next_epoch) {
    return absl::FailedPreconditionError(absl::StrCat("no prepared re-shard to epoch ", next_epoch,
                                                      " (it may have timed out)"));
  }
  if (switch_step < 0 || switch_step >= kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("switch step ", switch_step, " out of range"));
  }
  if (joining_) {
    joining_ = false;
    phase_ = Phase::kFilling;
    fill_expected_ = joining_old_shards_;
    fill_done_.clear();
    transfer_seen_ = false;
    switch_step_ = switch_step;
    switched_at_ = absl::Now();
    log::Info("shard {}: joining epoch {} at step {}; waiting for {} old shards' chunks", shard(),
              next_epoch, switch_step, fill_expected_);
    return absl::OkStatus();
  }
  if (switch_step <= freeze_after_) {
    return absl::InvalidArgumentError(absl::StrCat("switch step ", switch_step,
                                                   " is not past step ", freeze_after_,
                                                   ", which chunks here may have started"));
  }
  phase_ = Phase::kCommitted;
  switch_step_ = switch_step;
  freeze_after_ = switch_step - 1;
  log::Info("shard {}: re-shard to epoch {} committed at step {}", shard(), next_epoch, switch_step);
  if (switch_thread_.joinable()) switch_thread_.join();  // the last re-shard's, finished
  switch_thread_ = std::thread([this] { RunSwitch(); });
  return absl::OkStatus();
}

absl::Status ShardService::AbortReshard(uint64_t next_epoch, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  ExpirePrepareLocked();
  if (phase_ == Phase::kPrepared && next_config_.shard_map_epoch() == next_epoch) {
    log::Warn("shard {}: re-shard to epoch {} aborted ({}); staying on epoch {}", shard(), next_epoch,
              reason, epoch_.load());
    phase_ = Phase::kServing;
    freeze_after_ = kMaxStep;
    joining_ = false;
    return absl::OkStatus();
  }
  if (phase_ == Phase::kCommitted && next_config_.shard_map_epoch() == next_epoch) {
    return absl::FailedPreconditionError(absl::StrCat("re-shard to epoch ", next_epoch,
                                                      " is committed and cannot be aborted"));
  }
  return absl::OkStatus();  // nothing prepared: nothing to undo
}

absl::Status ShardService::WaitWhileFrozen(uint64_t epoch, int64_t step, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto clear = [this, epoch, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ExpirePrepareLocked();
    return shutting_down_ || epoch_.load() != epoch || phase_ != Phase::kPrepared ||
           step <= freeze_after_;
  };
  if (!AwaitLocked(clear, deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "call deadline passed while step ", step, " waited for a re-shard's switch step"));
  }
  if (shutting_down_) return absl::UnavailableError("shard shutting down");
  if (epoch_.load() != epoch) return absl::AbortedError(SupersededMessage(epoch));
  if (phase_ == Phase::kCommitted && step >= switch_step_) {
    return absl::AbortedError(SupersededMessage(epoch));
  }
  return absl::OkStatus();
}

void ShardService::RunSwitch() {
  int64_t switch_step = 0;
  {
    absl::MutexLock lock(&mu_);
    switch_step = switch_step_;
  }
  // The agreed boundary: every chunk here has completed switch_step - 1. If no chunk
  // completes a step for rpc_timeout_ms (a tensor not pushed every step, a lost worker),
  // the chunks move as they are: pushes of an unfinished step are answered Aborted and
  // resent to the new owner, so nothing is lost either way.
  const absl::Duration patience = absl::Milliseconds(config_.rpc_timeout_ms());
  absl::Time give_up = absl::Now() + patience;
  uint64_t completed_before = 0;
  while (true) {
    // Before any push (a job that has not started, or a tensor not yet pushed) the
    // boundary is still ahead, unless it is step 0.
    bool at_boundary = true;
    bool any_chunk = false;
    uint64_t completed = 0;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      for (const auto& [key, t] : tensors_) {
        for (const auto& [c, acc] : t->chunks) {
          const StepProgress p = acc->Progress();
          completed += static_cast<uint64_t>(p.completed_step + 1);
          any_chunk = true;
          // A result not yet replicated is not yet answered: the switch would cut it off.
          if (switch_step > 0 && (!p.started || p.completed_step < switch_step - 1 || p.pending ||
                                  p.unreplicated)) {
            at_boundary = false;
          }
        }
      }
    }
    if (switch_step > 0 && !any_chunk) at_boundary = false;
    if (at_boundary) break;
    if (completed != completed_before) give_up = absl::Now() + patience;  // training moves on
    completed_before = completed;
    if (absl::Now() >= give_up) {
      log::Warn("shard {}: no chunk completed a step for {} ms short of step {}; switching anyway",
                shard(), config_.rpc_timeout_ms(), switch_step - 1);
      break;
    }
    absl::SleepFor(absl::Milliseconds(1));
  }

  struct Leaving {
    std::shared_ptr<StepAccumulator> acc;
    std::string key;
    uint32_t chunk;
    uint32_t to;
  };
  std::vector<Leaving> leaving;
  std::vector<proto::TensorDeclaration> declarations;
  proto::ClusterConfig next;
  uint32_t from_shard = 0;
  std::string aborted_message;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    next = next_config_;
    from_shard = shard();
    const int new_index = IndexOf(next, self_address_);
    const cluster::ShardMap next_map(next.shards_size(), next.shard_map_epoch());
    uint64_t owned = 0;
    for (auto& [key, t] : tensors_) {
      declarations.push_back(t->Declaration(config_));
      std::vector<uint32_t> owner = next_map.Assign(key, t->layout);
      for (auto it = t->chunks.begin(); it != t->chunks.end();) {
        const uint32_t c = it->first;
        if (new_index >= 0 && owner[c] == static_cast<uint32_t>(new_index)) {
          ++chunks_kept_;
          ++it;
          continue;
        }
        leaving.push_back(Leaving{it->second, key, c, owner[c]});
        admission_->ReleaseMemory(OwnedChunkBytes(t->layout, t->dtype, t->optimizer, c));
        t->chunks.erase(it++);
      }
      if (new_index >= 0) {
        for (uint32_t c = 0; c < t->layout.num_chunks; ++c) {
          if (owner[c] != static_cast<uint32_t>(new_index) || t->chunks.contains(c)) continue;
          // Over the budget is logged, not refused: the chunk's state exists either way,
          // and refusing it here would lose it.
          absl::Status reserved = admission_->ReserveMemory(
              OwnedChunkBytes(t->layout, t->dtype, t->optimizer, c),
              absl::StrCat("chunk ", c, " of '", key, "' moved here by a re-shard"));
          if (!reserved.ok()) log::Warn("shard {}: {}", shard(), reserved.ToString());
          t->chunks[c] = MakeAccumulator(*t, c);
        }
      }
      t->owner = std::move(owner);
      owned += t->chunks.size();
    }
    left_epoch_ = epoch_.load();
    fill_expected_ = map_config_.shards_size();
    fill_done_ = {from_shard};
    transfer_seen_ = true;
    map_config_ = next;
    shard_map_ = next_map;
    epoch_ = next.shard_map_epoch();
    map_shards_ = next.shards_size();
    switched_at_ = absl::Now();
    chunks_owned_ = owned;
    metrics_->SetTensors(tensors_.size(), owned, epoch_.load());
    if (new_index >= 0) {
      shard_index_ = static_cast<uint32_t>(new_index);
      phase_ = fill_done_.size() >= fill_expected_ ? Phase::kServing : Phase::kFilling;
    } else {
      phase_ = Phase::kDrained;
    }
    down_.assign(next.shards_size(), false);
    joining_shards_.assign(next.shards_size(), false);
    if (replicas_ > 1 && new_index >= 0) {
      // The backups follow the new map. Moved chunks send their state to theirs before
      // their first answer (after Restore); kept ones with their next step, so that the
      // last old-map answers are not held up by backups still on the old map. Until then
      // a new backup is not synced, and a failover would report such a chunk lost, never
      // restart it empty.
      for (auto& [key, t] : tensors_) AssignRolesLocked(t.get());
    }
    aborted_message = SupersededMessage(left_epoch_);
    moves_sent_ = false;
    log::Info("shard {}: switched to epoch {} at step {}: {} chunks kept, {} leave{}", from_shard,
              next.shard_map_epoch(), switch_step, chunks_kept_, leaving.size(),
              new_index >= 0 ? absl::StrCat("; now shard ", new_index) : "; removed from the map");
  }
  // Outside mu_: a cancelled accumulator refuses every later push (Aborted), and its
  // snapshot is the state as of its last completed step.
  std::map<uint32_t, std::vector<proto::ChunkState>> moved;
  for (Leaving& l : leaving) {
    l.acc->Cancel(absl::AbortedError(aborted_message));
    absl::Status s = ChunkStateToProto(config_.job(), l.key, l.chunk, l.acc->elements(),
                                       l.acc->Snapshot(), &moved[l.to].emplace_back());
    if (!s.ok()) log::Error("shard {}: encoding chunk {} of '{}': {}", shard(), l.chunk, l.key, s.ToString());
  }
  leaving.clear();
  absl::Status sent = SendMoved(next, std::move(moved), declarations, from_shard);
  if (!sent.ok()) log::Error("shard {}: moving chunks for epoch {}: {}", shard(), next.shard_map_epoch(), sent.ToString());
  absl::MutexLock lock(&mu_);
  moves_sent_ = sent.ok();
}

absl::Status ShardService::SendMoved(const proto::ClusterConfig& next,
                                     std::map<uint32_t, std::vector<proto::ChunkState>> moved,
                                     const std::vector<proto::TensorDeclaration>& declarations,
                                     uint32_t from_shard) {
  for (int j = 0; j < next.shards_size(); ++j) {
    if (next.shards(j) == self_address_) continue;
    if (!options_.peers.send_transfer) {
      return absl::FailedPreconditionError("no transport to send moved chunks");
    }
    auto send = [&](proto::TransferRequest req) {
      req.set_job(config_.job());
      req.set_next_epoch(next.shard_map_epoch());
      req.set_from_shard(from_shard);
      return options_.peers.send_transfer(next.shards(j), req);
    };
    proto::TransferRequest first;
    for (const proto::TensorDeclaration& d : declarations) *first.add_declarations() = d;
    if (absl::Status s = send(std::move(first)); !s.ok()) return s;
    uint64_t chunks = 0, bytes = 0;
    for (proto::ChunkState& st : moved[j]) {
      std::vector<proto::ChunkState> parts = SplitChunkState(std::move(st));
      for (size_t i = 0; i < parts.size(); ++i) {
        bytes += parts[i].ByteSizeLong();
        proto::TransferRequest req;
        *req.mutable_part() = std::move(parts[i]);
        req.set_completes_chunk(i + 1 == parts.size());
        if (absl::Status s = send(std::move(req)); !s.ok()) return s;
      }
      ++chunks;
    }
    proto::TransferRequest last;
    last.set_last(true);
    if (absl::Status s = send(std::move(last)); !s.ok()) return s;
    absl::MutexLock lock(&mu_);
    chunks_sent_ += chunks;
    bytes_sent_ += bytes;
  }
  return absl::OkStatus();
}

absl::Status ShardService::AcceptTransfer(const proto::TransferRequest& r, absl::Time deadline) {
  if (r.job() != config_.job()) {
    return absl::NotFoundError(absl::StrCat("unknown job '", r.job(), "'"));
  }
  std::shared_ptr<StepAccumulator> acc;
  proto::ChunkState state;
  codec::DType dtype = codec::DType::kF32;
  {
    absl::MutexLock lock(&mu_);
    const uint64_t epoch = r.next_epoch();
    auto switched = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      ExpirePrepareLocked();
      const bool on_the_way = (phase_ == Phase::kPrepared || phase_ == Phase::kCommitted) &&
                              next_config_.shard_map_epoch() == epoch;
      return shutting_down_ || !on_the_way;
    };
    AwaitLocked(switched, deadline);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
    if (epoch_.load() != epoch || (phase_ != Phase::kFilling && phase_ != Phase::kServing)) {
      return (phase_ == Phase::kPrepared || phase_ == Phase::kCommitted)
                 ? absl::UnavailableError(absl::StrCat("not yet switched to epoch ", epoch, "; retry"))
                 : absl::FailedPreconditionError(absl::StrCat("no re-shard to epoch ", epoch,
                                                              " under way on this shard"));
    }
    if (fill_done_.count(r.from_shard()) != 0) return absl::OkStatus();  // a resent message
    if (!transfer_seen_) {
      // A shard the re-shard adds switches when the first old shard does (its own Commit
      // only armed it): its pause counts from here.
      transfer_seen_ = true;
      if (fill_done_.empty()) switched_at_ = absl::Now();
    }
    if (phase_ == Phase::kServing) {
      return absl::FailedPreconditionError(absl::StrCat("epoch ", epoch, " is already filled"));
    }
    if (r.from_shard() >= fill_expected_) {
      return absl::InvalidArgumentError(absl::StrCat("from_shard ", r.from_shard(), " out of range: the old map had ",
                                                     fill_expected_, " shards"));
    }
    for (const proto::TensorDeclaration& d : r.declarations()) {
      if (d.chunk_bytes() != config_.chunk_bytes()) {
        return absl::InvalidArgumentError(absl::StrCat("moved tensor '", d.key(), "' has chunk_bytes ",
                                                       d.chunk_bytes(), ", this shard ",
                                                       config_.chunk_bytes()));
      }
      if (absl::Status s = CheckKey(d.key()); !s.ok()) return s;
      absl::StatusOr<codec::DType> dt = cluster::FromProto(d.dtype());
      if (!dt.ok()) return dt.status();
      if (d.elements() == 0 || d.elements() > (uint64_t{1} << 36)) {
        return absl::InvalidArgumentError(absl::StrCat("moved tensor '", d.key(), "': bad element count ", d.elements()));
      }
      absl::StatusOr<cluster::OptimizerOptions> opt = OptimizerFrom(d.optimizer());
      if (!opt.ok()) return opt.status();
      proto::DeclareTensorRequest req;
      req.set_key(d.key());
      req.set_elements(d.elements());
      *req.mutable_optimizer() = d.optimizer();
      absl::StatusOr<Tensor*> t = DeclareLocked(req, *dt, *opt, /*fresh=*/false);
      if (!t.ok()) return t.status();
    }
    if (r.has_part()) {
      const proto::ChunkState& part = r.part();
      if (absl::Status s = CheckKey(part.key()); !s.ok()) return s;
      // Only chunks this shard owns are held, so what a sender can make it buffer is bounded
      // by this shard's own state.
      auto it = tensors_.find(part.key());
      if (it == tensors_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("moved chunk of undeclared tensor '", part.key(), "'"));
      }
      auto owned = it->second->chunks.find(part.chunk());
      if (owned == it->second->chunks.end()) {
        return absl::InvalidArgumentError(absl::StrCat("chunk ", part.chunk(), " of '", part.key(),
                                                       "' moved here, but shard ", shard(),
                                                       " does not own it under epoch ", epoch));
      }
      proto::ChunkState& merged = partial_[{part.key(), part.chunk()}];
      MergeChunkStatePart(part, &merged);
      if (r.completes_chunk()) {
        state = std::move(merged);
        partial_.erase({part.key(), part.chunk()});
        acc = owned->second;
        dtype = it->second->dtype;
      }
    }
  }
  if (acc != nullptr) {
    absl::StatusOr<ChunkSnapshot> snap = ChunkStateFromProto(state, acc->elements(), dtype);
    if (!snap.ok()) return snap.status();
    StampEpoch(epoch_.load(), &*snap);
    if (absl::Status s = acc->Restore(*std::move(snap)); !s.ok()) return s;
  }
  absl::MutexLock lock(&mu_);
  if (acc != nullptr) ++chunks_received_;
  if (r.last()) {
    fill_done_.insert(r.from_shard());
    if (phase_ == Phase::kFilling && fill_done_.size() >= fill_expected_) {
      phase_ = Phase::kServing;
      pause_ms_ = absl::ToDoubleMilliseconds(absl::Now() - switched_at_);
      log::Info("shard {}: serving epoch {} ({} chunks received, {:.1f} ms after the switch)",
                shard(), epoch_.load(), chunks_received_, pause_ms_);
    }
  }
  return absl::OkStatus();
}

proto::ClusterConfig ShardService::CurrentConfig() const {
  absl::MutexLock lock(&mu_);
  return phase_ == Phase::kCommitted ? next_config_ : map_config_;
}

void ShardService::ReshardStatus(proto::ReshardStatusResponse* r) const {
  absl::MutexLock lock(&mu_);
  ExpirePrepareLocked();
  static constexpr const char* kNames[] = {"serving", "prepared", "committed", "filling", "drained"};
  r->set_state(kNames[static_cast<int>(phase_)]);
  r->set_shard_map_epoch(epoch_.load());
  r->set_switch_step(switch_step_);
  r->set_chunks_sent(chunks_sent_);
  r->set_bytes_sent(bytes_sent_);
  r->set_chunks_received(chunks_received_);
  r->set_chunks_kept(chunks_kept_);
  r->set_chunks_owned(chunks_owned_.load());
  r->set_pause_ms(pause_ms_);
  r->set_moves_sent(moves_sent_);
  r->set_replicas(replicas_);
  *r->mutable_down_shards() = map_config_.down_shards();
  r->set_degraded(replicas_ > 1 && map_config_.down_shards_size() > 0);
  r->set_failovers(failovers_);
  r->set_chunks_promoted(chunks_promoted_);
  r->set_replications_sent(replications_sent_.load());
  r->set_chunks_lost(chunks_lost_);
  *r->mutable_joining_shards() = map_config_.joining_shards();
  r->set_tensors(tensors_.size());
  if (rejoining_) r->set_state("rejoining");
}

}  // namespace gcomp::server
