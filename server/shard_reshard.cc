// ShardService's live re-sharding (docs/SERVICE.md, "Re-sharding"): Prepare, Commit and
// Abort from the coordinator, the switch at the agreed step, and the transfer of moved
// chunk state between old and new owners.
#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "cluster/cluster_config.h"
#include "server/chunk_state.h"
#include "server/shard_service.h"
#include "server/shard_tensor.h"

namespace gcomp::server {
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

void ShardService::ExpirePrepareLocked() const {
  if (phase_ != Phase::kPrepared || absl::Now() < prepare_deadline_) return;
  log::Warn("shard {}: no commit of the re-shard to epoch {} within the prepare timeout; "
            "staying on epoch {}",
            shard(), next_config_.shard_map_epoch(), epoch_.load());
  SetPhaseLocked(Phase::kServing);
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
  if (r.at_step() < 0 || r.at_step() >= kMaxStep) {
    return absl::InvalidArgumentError(
        absl::StrCat("re-shard at_step ", r.at_step(), " out of range [0, 2^62)"));
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
  if (switch_running_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "still sending the chunks that the re-shard to epoch ", epoch_.load(),
        " moved away (a new shard that does not answer holds them up to 60 s); try again "
        "when it is done"));
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
    SetPhaseLocked(Phase::kPrepared);
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
  SetPhaseLocked(Phase::kPrepared);
  prepare_deadline_ = deadline;
  freeze_after_ = std::max(highest, r.at_step() - 1);
  response.set_in_old_map(true);
  response.set_highest_step(freeze_after_);
  static log::LineBudget* const prepared = new log::LineBudget(10, "prepared re-shards");
  if (prepared->Admit()) {
    log::Info(
        "shard {}: prepared re-shard from epoch {} ({} shards) to epoch {} ({} shards); "
        "steps after {} wait",
        shard(), epoch_.load(), map_config_.shards_size(), next.shard_map_epoch(),
        next.shards_size(), freeze_after_);
  }
  return response;
}

absl::Status ShardService::CommitReshard(uint64_t next_epoch, int64_t switch_step) {
  absl::ReleasableMutexLock lock(&mu_);
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
    SetPhaseLocked(Phase::kFilling);
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
  SetPhaseLocked(Phase::kCommitted);
  switch_step_ = switch_step;
  freeze_after_ = switch_step - 1;
  log::Info("shard {}: re-shard to epoch {} committed at step {}", shard(), next_epoch, switch_step);
  // The last re-shard's thread has ended or is about to (a Prepare waits for its moves):
  // joined outside mu_, which its last lines take.
  std::thread previous = std::move(switch_thread_);
  switch_running_ = true;
  switch_thread_ = std::thread([this] { RunSwitch(); });
  lock.Release();
  if (previous.joinable()) previous.join();
  return absl::OkStatus();
}

absl::Status ShardService::AbortReshard(uint64_t next_epoch, const std::string& reason) {
  absl::MutexLock lock(&mu_);
  ExpirePrepareLocked();
  if (phase_ == Phase::kPrepared && next_config_.shard_map_epoch() == next_epoch) {
    static log::LineBudget* const aborted = new log::LineBudget(10, "aborted re-shards");
    if (aborted->Admit()) {
      log::Warn("shard {}: re-shard to epoch {} aborted ({}); staying on epoch {}", shard(),
                next_epoch, log::Clip(reason), epoch_.load());
    }
    SetPhaseLocked(Phase::kServing);
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
  // The agreed boundary: every chunk here has completed switch_step - 1, except chunks
  // that are idle more than one step behind it: a tensor not pushed every step (DDP's
  // buckets from before its first-iteration rebuild are never pushed again) would
  // otherwise hold the switch, and with it every worker, for the whole patience below.
  // If no chunk completes a step for rpc_timeout_ms (a lost worker), the chunks move as
  // they are. Either way nothing is lost: a later push of a chunk that moved unfinished
  // or behind is answered Aborted and resent to the new owner.
  const absl::Duration patience = absl::Milliseconds(config_.rpc_timeout_ms());
  absl::Time give_up = absl::Now() + patience;
  uint64_t completed_before = 0;
  while (true) {
    // Before any push (a job that has not started) the boundary is still ahead, unless
    // it is step 0.
    bool at_boundary = true;
    bool any_done = false;
    uint64_t completed = 0;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      for (const auto& [key, t] : tensors_) {
        for (const auto& [c, acc] : t->chunks) {
          const StepProgress p = acc->Progress();
          completed += static_cast<uint64_t>(p.completed_step + 1);
          if (switch_step == 0) continue;
          // A result not yet replicated is not yet answered: the switch would cut it off.
          const bool busy = p.pending || p.unreplicated;
          const bool done = p.started && p.completed_step >= switch_step - 1 && !busy;
          const bool left_behind = !busy && (!p.started || p.completed_step < switch_step - 2);
          any_done = any_done || done;
          if (!done && !left_behind) at_boundary = false;
        }
      }
    }
    if (switch_step > 0 && !any_done) at_boundary = false;
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
    // ReshardStatus reports this re-shard's moves: they were summed over every re-shard
    // since the shard started (a second re-shard reported the first one's chunks too).
    chunks_kept_ = 0;
    chunks_received_ = 0;
    chunks_sent_ = 0;
    bytes_sent_ = 0;
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
      SetPhaseLocked(fill_done_.size() >= fill_expected_ ? Phase::kServing : Phase::kFilling);
    } else {
      SetPhaseLocked(Phase::kDrained);
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
  switch_running_ = false;
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
  if (absl::Status s = CheckJob(r.job(), /*name_ours=*/false); !s.ok()) return s;
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
    if (absl::Status s = AwaitEpochLocked(switched, deadline, epoch, EpochWaiter::kTransfer);
        !s.ok()) {
      return s;
    }
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
      // As for replicas: each block at most one chunk's encoded size.
      if (absl::Status s = CheckChunkStatePart(part, it->second->layout.size(part.chunk()),
                                               MaxNameBytes(), "moved part");
          !s.ok()) {
        return s;
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
      SetPhaseLocked(Phase::kServing);
      pause_ms_ = absl::ToDoubleMilliseconds(absl::Now() - switched_at_);
      log::Info("shard {}: serving epoch {} ({} chunks received, {:.1f} ms after the switch)",
                shard(), epoch_.load(), chunks_received_, pause_ms_);
    }
  }
  return absl::OkStatus();
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
  r->set_caught_up(CaughtUpLocked());
}

}  // namespace gcomp::server
