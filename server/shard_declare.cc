// ShardService's tensor declarations: checking a DeclareTensor, admitting its memory
// against the budget, and making the accumulators of the chunks this shard owns.
#include <algorithm>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "cluster/wire_block.h"
#include "server/shard_service.h"
#include "server/shard_tensor.h"

namespace gcomp::server {
namespace {

// Bookkeeping per tensor and per owned chunk beyond the float arrays (the accumulator, map
// entries, per-worker vectors): an estimate on the high side, so the budget errs safe.
constexpr uint64_t kTensorOverheadBytes = 768;
constexpr uint64_t kChunkOverheadBytes = 1024;

bool SameOptimizer(const cluster::OptimizerOptions& a, const cluster::OptimizerOptions& b) {
  return a.kind == b.kind && a.learning_rate == b.learning_rate && a.momentum == b.momentum &&
         a.beta1 == b.beta1 && a.beta2 == b.beta2 && a.epsilon == b.epsilon;
}

// The settings that take part in an update: "momentum (learning_rate 0.01, momentum 0.9)".
std::string DescribeOptimizer(const cluster::OptimizerOptions& o) {
  switch (o.kind) {
    case cluster::OptimizerKind::kNone:
      return "none";
    case cluster::OptimizerKind::kSgd:
      return absl::StrCat("sgd (learning_rate ", o.learning_rate, ")");
    case cluster::OptimizerKind::kMomentum:
      return absl::StrCat("momentum (learning_rate ", o.learning_rate, ", momentum ", o.momentum,
                          ")");
    case cluster::OptimizerKind::kAdam:
      return absl::StrCat("adam (learning_rate ", o.learning_rate, ", beta1 ", o.beta1, ", beta2 ",
                          o.beta2, ", epsilon ", o.epsilon, ")");
  }
  return "?";
}

}  // namespace

absl::Status ShardService::DeclareTensor(const proto::DeclareTensorRequest& r,
                                         proto::DeclareTensorResponse* response,
                                         absl::Time deadline) {
  if (absl::Status s = CheckJobAndEpoch(r.job(), r.shard_map_epoch(), deadline); !s.ok()) return s;
  absl::Status key_ok = CheckKey(r.key());
  if (!key_ok.ok()) return key_ok;
  absl::StatusOr<codec::DType> dtype = cluster::FromProto(r.dtype());
  if (!dtype.ok()) return dtype.status();
  if (absl::Status s = cluster::CheckTensorElements(r.key(), r.elements()); !s.ok()) return s;
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

  absl::StatusOr<std::optional<Placement>> placed = PlaceUnlocked(r, layout, *dtype, *opt);
  if (!placed.ok()) return placed.status();
  std::optional<Placement>& placement = *placed;
  // The placement's memory was reserved for it; once declared, the owner table's own
  // reservation covers what the tensor keeps of it.
  absl::Cleanup release = [&] {
    if (placement) admission_->ReleaseMemory(placement->reserved_bytes);
  };
  std::vector<std::pair<std::shared_ptr<StepAccumulator>, const proto::ChunkValue*>> initial;
  codec::DType tensor_dtype;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
    absl::StatusOr<Tensor*> tensor =
        DeclareLocked(r, *dtype, *opt, /*fresh=*/true, placement ? &*placement : nullptr);
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
    // Listed only while the list fits in a reply: a declaration that succeeded must not be
    // answered with a message too large to send (the client would retry it for good).
    constexpr size_t kMaxListedChunks = 65536;  // as proto/aggregation.proto says
    response->set_owned_chunk_count((*tensor)->chunks.size());
    if ((*tensor)->chunks.size() <= kMaxListedChunks) {
      for (const auto& [c, acc] : (*tensor)->chunks) response->add_owned_chunks(c);
    }
  }
  // Initial values (parameters for an optimizer); chunks not owned here are ignored.
  for (const auto& [acc, init] : initial) {
    std::vector<float> value(acc->elements());
    codec::ToF32(tensor_dtype, init->data().data(), value.size(), value.data());
    acc->SetInitial(value);
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckShareFits(const proto::DeclareTensorRequest& r,
                                          const cluster::ChunkLayout& layout, codec::DType dtype,
                                          const cluster::OptimizerOptions& opt,
                                          uint32_t shards) const {
  // A tensor far too large for this shard is refused before its chunks are assigned:
  // assigning millions of chunks takes a fraction of a second and memory of its own. With
  // many chunks a shard, its share of the state is close to the fair one (replicas / shards
  // of the whole), so half of that must fit now.
  if (layout.num_chunks < uint64_t{1024} * shards) return absl::OkStatus();
  const uint64_t share =
      OwnedChunkBytes(layout, dtype, opt, 0) / 2 * layout.num_chunks / shards * replicas_;
  return admission_->CheckMemory(
      share,
      absl::StrCat("declaring '", r.key(), "' (", codec::DTypeName(dtype), " x ", r.elements(),
                   ", half this shard's expected share of ", layout.num_chunks, " chunks)"));
}

absl::StatusOr<std::optional<ShardService::Placement>> ShardService::PlaceUnlocked(
    const proto::DeclareTensorRequest& r, const cluster::ChunkLayout& layout, codec::DType dtype,
    const cluster::OptimizerOptions& opt) {
  // Below this many chunks the placement takes under a few milliseconds.
  constexpr uint64_t kPlaceUnlockedChunks = 1 << 16;
  if (layout.num_chunks < kPlaceUnlockedChunks) return std::nullopt;
  Placement p{cluster::ShardMap(1, 0), {}, {}, 0, {}, 0};
  {
    absl::MutexLock lock(&mu_);
    if (tensors_.count(r.key()) != 0 || tensors_.size() >= config_.limits().max_tensors()) {
      return std::nullopt;  // answered at once under the lock
    }
    // A tensor that cannot fit is refused before anything is placed, under the lock as in
    // DeclareLocked (which checks again under the map it declares in).
    if (absl::Status fits = CheckShareFits(r, layout, dtype, opt, shard_map_.num_shards());
        !fits.ok()) {
      return fits;
    }
    p.map = shard_map_;
    p.down = down_;
    p.joining = joining_shards_;
    p.self = shard_index_.load();
  }
  // Reserved before it is made, so that concurrent declarations cannot allocate past the
  // budget: the placement and, while it is made, the map's assignment of every chunk.
  const uint64_t bytes = uint64_t{layout.num_chunks} * (replicas_ + 1) * sizeof(uint32_t);
  if (absl::Status s = admission_->ReserveMemory(
          bytes, absl::StrCat("placing '", r.key(), "' (", layout.num_chunks, " chunks)"));
      !s.ok()) {
    return s;
  }
  p.reserved_bytes = bytes;
  p.live = p.map.LiveReplicas(r.key(), layout, replicas_, p.down, p.joining);
  return std::optional<Placement>(std::move(p));
}

absl::StatusOr<ShardService::Tensor*> ShardService::DeclareLocked(
    const proto::DeclareTensorRequest& r, codec::DType dtype, const cluster::OptimizerOptions& opt,
    bool fresh, Placement* placement) {
  const cluster::ChunkLayout layout(r.elements(), codec::DTypeBytes(dtype), config_.chunk_bytes());
  auto it = tensors_.find(r.key());
  if (it != tensors_.end()) {
    Tensor* t = it->second.get();
    const bool same_optimizer = SameOptimizer(t->optimizer, opt);
    if (t->dtype != dtype || t->layout.elements != r.elements()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "tensor '", r.key(), "' already declared as ", codec::DTypeName(t->dtype), " x ",
          t->layout.elements, "; this request declares ", codec::DTypeName(dtype), " x ",
          r.elements(),
          " (every worker must declare a key alike; another model or job needs other keys)"));
    }
    if (!same_optimizer) {
      // Most often a config whose optimizer changed, restarted from a checkpoint that keeps
      // the settings each key was declared with.
      return absl::AlreadyExistsError(absl::StrCat(
          "tensor '", r.key(), "' already declared with optimizer ",
          DescribeOptimizer(t->optimizer), "; this request declares it with ",
          DescribeOptimizer(opt),
          ". A key keeps its optimizer settings, through checkpoints too: every worker must "
          "declare it alike, and a changed optimizer in the config needs other keys or a "
          "checkpoint directory without this job's sets (docs/CHECKPOINT.md)"));
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
  if (absl::Status fits = CheckShareFits(r, layout, dtype, opt, shard_map_.num_shards());
      !fits.ok()) {
    return fits;
  }
  // The owner table first (it is what Assign allocates), then the owned chunks' state:
  // both reserved before anything is allocated.
  const uint64_t table_bytes = OwnerTableBytes(r.key(), layout, replicas_);
  absl::Status reserved = admission_->ReserveMemory(
      table_bytes, absl::StrCat("declaring '", r.key(), "' (", layout.num_chunks,
                                " chunks, owner table)"));
  if (!reserved.ok()) return reserved;
  // A placement computed beforehand holds while the map, the down and joining shards and
  // this shard's index are those it was computed for.
  const bool placed = placement != nullptr && placement->map.epoch() == shard_map_.epoch() &&
                      placement->map.num_shards() == shard_map_.num_shards() &&
                      placement->down == down_ && placement->joining == joining_shards_ &&
                      placement->self == shard_index_.load() &&
                      placement->live.size() == size_t{layout.num_chunks} * replicas_;
  std::vector<uint32_t> live =
      placed ? std::move(placement->live)
             : shard_map_.LiveReplicas(r.key(), layout, replicas_, down_, joining_shards_);
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
  log::Info("shard {}: declared '{}' {} x {} in {} chunks, {} owned here", self, log::Clip(r.key()),
            std::string(codec::DTypeName(dtype)), r.elements(), layout.num_chunks,
            t->chunks.size());
  Tensor* raw = t.get();
  chunks_owned_ += t->chunks.size();
  ++tensors_declared_;
  tensors_[r.key()] = std::move(t);
  metrics_->SetTensors(tensors_.size(), chunks_owned_, epoch_.load());
  return raw;
}

uint64_t ShardService::OwnerTableBytes(const std::string& key, const cluster::ChunkLayout& layout,
                                       uint32_t replicas) {
  // The key is kept three times: the tensor map's key, the tensor's own, its chunks' labels.
  return kTensorOverheadBytes + 3 * key.size() +
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

std::shared_ptr<StepAccumulator> ShardService::MakeAccumulator(const Tensor& t, uint32_t c) {
  StepAccumulatorOptions ao;
  ao.workers = config_.workers();
  ao.step_timeout = absl::Milliseconds(config_.step_timeout_ms());
  ao.label = absl::StrCat("key '", t.key, "' chunk ", c);
  ao.admission = admission_.get();
  ShardMetrics* metrics = metrics_.get();
  const uint64_t raw_bytes = t.layout.size(c) * codec::DTypeBytes(t.dtype);
  ao.on_step_completed = [this, metrics, raw_bytes](const StepTimings& timings) {
    steps_completed_.fetch_add(1, std::memory_order_relaxed);
    metrics->ObserveStep(timings, raw_bytes);
  };
  ao.on_step_failed = [this, metrics] {
    steps_failed_.fetch_add(1, std::memory_order_relaxed);
    metrics->CountStepFailed();
  };
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

}  // namespace gcomp::server
