// ShardService's checkpoints (docs/CHECKPOINT.md): periodic snapshots gathered per step
// and written by a background thread, the final checkpoint, and the start-up restore.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "server/checkpoint.h"
#include "server/chunk_state.h"
#include "server/shard_service.h"
#include "server/shard_tensor.h"

namespace gcomp::server {
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
  if (step <= ckpt_dispatched_step_) {
    if (reserved.ok()) admission_->ReleaseMemory(bytes);
    return;
  }
  auto [pending, inserted] = pending_ckpt_.try_emplace(step);
  PendingCheckpoint& p = pending->second;
  if (inserted) {
    // The map the step ran under: a re-shard may switch before the set is written.
    p.shard = shard();
    p.epoch = epoch_.load();
    p.shards = map_shards_.load();
    p.declared = tensors_declared_.load();
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
    ckpt_dispatched_step_ = std::max(ckpt_dispatched_step_, step);
  }
  // Chunks step one at a time, and a chunk completes this boundary only after every worker
  // got its results of the step before, so a chunk missing from an earlier boundary's set
  // now has completed no step since that boundary: one declared but never pushed (or no
  // longer pushed, as an old model's keys) would otherwise hold every later set back, and
  // their snapshots in memory, for good.
  while (!pending_ckpt_.empty() && pending_ckpt_.begin()->first < step) {
    auto earlier = pending_ckpt_.begin();
    earlier->second.fill = true;
    ready_ckpt_.emplace_back(earlier->first, std::move(earlier->second));
    ckpt_dispatched_step_ = std::max(ckpt_dispatched_step_, earlier->first);
    pending_ckpt_.erase(earlier);
  }
}

bool ShardService::FillCheckpoint(int64_t step, PendingCheckpoint* p) {
  absl::flat_hash_set<std::pair<std::string, uint32_t>> present;
  for (const auto& [id, snap] : p->chunks) present.insert(id);
  // The accumulators are gathered under mu_ (as a reader: pushes go on) and copied after.
  std::vector<std::pair<std::pair<std::string, uint32_t>, std::shared_ptr<StepAccumulator>>> idle;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (epoch_.load() != p->epoch) {
      log::Warn(
          "shard {}: skipping the checkpoint of step {}: the shard map changed before "
          "its last chunks were in",
          shard(), step);
      return false;
    }
    for (const auto& [key, t] : tensors_) {
      for (const auto& [c, acc] : t->chunks) {
        if (!present.contains(std::make_pair(key, c)))
          idle.emplace_back(std::make_pair(key, c), acc);
      }
    }
  }
  std::vector<std::pair<std::pair<std::string, uint32_t>, ChunkSnapshot>> added;
  uint64_t bytes = 0;
  for (const auto& [id, acc] : idle) {
    added.emplace_back(id, acc->Snapshot());
    bytes += SnapshotBytes(added.back().second);
    // A key on a step count of its own (a second model, a GAN's other half) may have
    // moved on since the boundary: its state now is not its state then.
    if (added.back().second.completed_step > step) {
      log::Warn(
          "shard {}: skipping the checkpoint of step {}: '{}' chunk {} completed step {} "
          "before its copy for that step was taken (keys on their own step counts)",
          shard(), step, log::Clip(id.first), id.second, added.back().second.completed_step);
      return false;
    }
  }
  absl::Status reserved = admission_->ReserveMemory(
      bytes, absl::StrCat("checkpoint of step ", step, " (", added.size(), " idle chunks)"));
  if (!reserved.ok()) {
    log::Warn("shard {}: skipping the checkpoint of step {}: {}", shard(), step,
              std::string(reserved.message()));
    return false;
  }
  p->reserved_bytes += bytes;
  for (auto& a : added) p->chunks.push_back(std::move(a));
  return true;
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
    if (!job.second.refused && (!job.second.fill || FillCheckpoint(job.first, &job.second))) {
      absl::Status s =
          WriteCheckpoint(false, job.first, job.second.shard, job.second.shards, job.second.epoch,
                          job.second.declared, std::move(job.second.chunks));
      if (absl::IsAborted(s)) {
        log::Warn("shard {}: skipping the checkpoint of step {}: {}", shard(), job.first,
                  std::string(s.message()));
      } else if (!s.ok()) {
        log::Error("shard {}: checkpoint of step {} failed: {}", shard(), job.first, s.ToString());
      }
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
    bool final, int64_t step, uint32_t shard, uint32_t shards, uint64_t epoch, uint64_t declared,
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
    if (!final && tensors_declared_.load() != declared) {
      // Another shard may have written this set before the tensor reached it: the set
      // would then name a tensor whose chunks are not all in it. The next set holds it.
      return absl::AbortedError("a tensor was declared after the step's boundary");
    }
    for (const auto& [key, t] : tensors_) c.declarations.push_back(t->Declaration(config_));
    // Owners follow the map now in force: only for the set's own map do they say which
    // shards write no manifest. The scan stops once every shard is seen owning a chunk.
    if (epoch_.load() == epoch) {
      std::vector<bool> owns(shards, false);
      uint32_t owning = 0;
      for (auto it = tensors_.begin(); it != tensors_.end() && owning < shards; ++it) {
        for (uint32_t owner : it->second->owner) {
          if (owner < shards && !owns[owner]) owns[owner] = true, ++owning;
        }
      }
      for (uint32_t k = 0; k < shards; ++k) {
        if (!owns[k] && k != shard) c.idle_shards.push_back(k);
      }
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
  const int64_t step_written = c.step;
  absl::StatusOr<uint64_t> bytes =
      WriteShardCheckpoint(checkpoint_dir_, std::move(c), config_.checkpoint().keep());
  if (!bytes.ok()) return bytes.status();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  log::Info("shard {}: checkpoint {} written: {} chunks, {} bytes in {:.3f} s", shard,
            set_name, chunk_count, *bytes, seconds);
  metrics_->ObserveCheckpoint(*bytes, seconds, step_written);
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
  return WriteCheckpoint(true, -1, shard(), shards, epoch_.load(), /*declared=*/0,
                         std::move(chunks));
}

absl::StatusOr<LoadedCheckpoint> ShardService::LoadForRestore(const std::string& only_set,
                                                               CheckedStates* checked_out) {
  const std::string& dir = checkpoint_dir_;
  // Every chunk state is decoded and checked before anything is declared: a set whose states
  // cannot be restored (damage behind valid checksums, a forged file) is skipped for an older
  // one, as a damaged set is, instead of stopping the shard for good. All of them, not only
  // this shard's: every shard must come to the same set. Those it owns are kept for the
  // restore below.
  cluster::ShardMap map(1, 0);
  std::vector<bool> down, joining;
  uint32_t self = 0;
  {
    absl::MutexLock lock(&mu_);
    map = shard_map_;
    down = down_;
    joining = joining_shards_;
    self = shard_index_.load();
  }
  CheckedStates& checked = *checked_out;
  struct Declared {  // what each chunk of a declared tensor is checked against
    std::string declaration;  // serialized: a set tried next may declare the key otherwise
    cluster::ChunkLayout layout;
    codec::DType dtype;
    cluster::OptimizerOptions optimizer;
    std::vector<uint32_t> live;
  };
  absl::flat_hash_map<std::string, Declared> tensors;
  LoadOptions options;
  options.begin_set = [&] {
    checked.clear();
    tensors.clear();
  };
  // Every chunk of the set is decoded and checked; only those this shard owns or backs up
  // under its map stay in memory (the owned ones decoded, for RestoreLoaded).
  options.keep = [&](const proto::TensorDeclaration& d,
                     proto::ChunkState* record) -> absl::StatusOr<bool> {
    const proto::ChunkState& st = *record;
    auto it = tensors.find(d.key());
    if (it == tensors.end() || it->second.declaration != d.SerializeAsString()) {
      absl::StatusOr<codec::DType> dtype = cluster::FromProto(d.dtype());
      if (!dtype.ok()) return dtype.status();
      absl::StatusOr<cluster::OptimizerOptions> opt = OptimizerFrom(d.optimizer());
      if (!opt.ok()) return opt.status();
      const cluster::ChunkLayout layout(d.elements(), codec::DTypeBytes(*dtype), d.chunk_bytes());
      it = tensors
               .insert_or_assign(d.key(),
                                 Declared{d.SerializeAsString(), layout, *dtype, *opt,
                                          map.LiveReplicas(d.key(), layout, replicas_, down, joining)})
               .first;
    }
    const Declared& t = it->second;
    const size_t n = t.layout.size(st.chunk());
    absl::StatusOr<ChunkSnapshot> snap = ChunkStateFromProto(st, n, t.dtype);
    if (!snap.ok()) return snap.status();
    absl::Status s = StepAccumulator::CheckSnapshot(
        *snap, t.optimizer, n, absl::StrCat("key '", st.key(), "' chunk ", st.chunk()));
    if (!s.ok()) return s;
    const size_t first = size_t{st.chunk()} * replicas_;
    if (t.live[first] == self) {
      checked[{st.key(), st.chunk()}] = *std::move(snap);
      // Decoded: RestoreLoaded needs only which chunk it is.
      record->clear_value();
      record->clear_first_moment();
      record->clear_second_moment();
      record->clear_cached_result();
      return true;
    }
    for (uint32_t r = 1; r < replicas_; ++r) {
      if (t.live[first + r] == self) return true;  // a backup copy (RestoreLoaded)
    }
    return false;
  };
  options.accept = [&](const LoadedCheckpoint& c) -> absl::Status {
    if (!only_set.empty() && CheckpointSetName(c.final, c.step, c.shards) != only_set) {
      return absl::FailedPreconditionError(
          absl::StrCat("not the set this run restores (", only_set, ")"));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(dir, options);
  if (only_set.empty() || (loaded.ok() && CheckpointSetName(loaded->final, loaded->step, loaded->shards) == only_set)) return loaded;
  // The run names the set every shard restores: no other will do.
  std::string why = loaded.ok() ? "" : std::string(loaded.status().message());
  if (loaded.ok()) {
    for (const std::string& problem : loaded->skipped) {
      if (problem.find(only_set) != std::string::npos) why = problem;
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the job's run (in etcd) restores checkpoint set ", only_set, ", which this shard cannot "
      "restore from ", dir, why.empty() ? ": not there" : absl::StrCat(": ", why),
      "; give every shard the same checkpoint.dir contents, or delete the run record to "
      "choose anew"));
}

absl::Status ShardService::RefuseSetsOutsideTheJobDir() const {
  if (checkpoint_dir_.empty() || !ListCheckpointSets(checkpoint_dir_).empty()) {
    return absl::OkStatus();
  }
  // Sets written before checkpoints moved into a directory per job: starting empty would
  // silently drop this job's state, so the shard asks for the move instead.
  const std::string& root = config_.checkpoint().dir();
  if (ListCheckpointSets(root).empty()) return absl::OkStatus();
  absl::StatusOr<LoadedCheckpoint> old = LoadLatestCheckpoint(root);
  if (!old.ok() || old->job != config_.job()) return absl::OkStatus();  // not this job's
  return absl::FailedPreconditionError(absl::StrCat(
      "checkpoint sets of job '", config_.job(), "' are in ", root,
      ", where shards before per-job directories wrote them; this shard restores from ",
      checkpoint_dir_, ". Move them there with every shard stopped: mkdir -p ", checkpoint_dir_,
      " && mv ", root, "/step-* ", root, "/final-* ", checkpoint_dir_, "/"));
}

absl::Status ShardService::RestoreFromCheckpoint() {
  // Checked now rather than at the first checkpoint, which would fail only in the log while
  // training went on without any.
  if (absl::Status st = CheckCheckpointDirWritable(checkpoint_dir_); !st.ok()) return st;
  CheckedStates checked;
  absl::StatusOr<LoadedCheckpoint> loaded = LoadForRestore("", &checked);
  if (absl::IsNotFound(loaded.status())) {
    log::Info("shard {}: no checkpoint in {}; starting empty", shard(), checkpoint_dir_);
    return absl::OkStatus();
  }
  if (!loaded.ok()) return loaded.status();
  return RestoreLoaded(*std::move(loaded), std::move(checked));
}

absl::Status ShardService::RestoreLoaded(LoadedCheckpoint loaded_set, CheckedStates checked) {
  LoadedCheckpoint* loaded = &loaded_set;
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
  uint64_t backed_up = 0;
  for (proto::ChunkState& st : loaded->chunks) {
    std::shared_ptr<StepAccumulator> acc;
    codec::DType dtype = codec::DType::kF32;
    {
      absl::MutexLock lock(&mu_);
      Tensor* t = tensors_.at(st.key()).get();
      auto it = t->chunks.find(st.chunk());
      if (auto b = t->backups.find(st.chunk()); it == t->chunks.end() && b != t->backups.end()) {
        // Backed up here: the set holds the owner's state at the same step, so the copy
        // is synced from the start (not one copy until the first step replicates it).
        b->second.state = std::move(st);
        b->second.has_state = true;
        b->second.synced = true;
        ++backed_up;
        continue;
      }
      if (it == t->chunks.end()) continue;  // owned by another shard under this config
      acc = it->second;
      dtype = t->dtype;
    }
    auto done = checked.find({st.key(), st.chunk()});
    absl::StatusOr<ChunkSnapshot> snap = done != checked.end()
                                             ? std::move(done->second)
                                             : ChunkStateFromProto(st, acc->elements(), dtype);
    if (snap.ok()) StampEpoch(epoch_.load(), &*snap);
    absl::Status s = snap.ok() ? acc->Restore(*std::move(snap)) : snap.status();
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("restoring checkpoint ", loaded->path, ": ", s.message()));
    }
    ++restored;
  }
  restored_from_ = loaded->path;
  restored_step_ = loaded->step;
  log::Info("shard {}: restored {} chunks of {} tensors from {} (step {}, {} backup copies, {} "
            "bytes read, {:.3f} s){}",
            shard(), restored, loaded->declarations.size(), loaded->path, loaded->step, backed_up,
            loaded->bytes, absl::ToDoubleSeconds(absl::Now() - start),
            loaded->skipped.empty() ? "" : absl::StrCat("; skipped newer: ", loaded->skipped.size()));
  return absl::OkStatus();
}

}  // namespace gcomp::server
