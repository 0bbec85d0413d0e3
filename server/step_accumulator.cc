#include "server/step_accumulator.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace gcomp::server {
namespace {

// Tiles: a fixed trip count and unaliased pointers let the compiler vectorize the loops
// at -O2.
constexpr size_t kMeanTile = 2048;

void AddTile(float* __restrict sum, const float* __restrict x) {
  for (size_t i = 0; i < kMeanTile; ++i) sum[i] += x[i];
}
void MulTile(float* __restrict sum, float factor) {
  for (size_t i = 0; i < kMeanTile; ++i) sum[i] *= factor;
}
void DivTile(float* __restrict sum, float divisor) {
  for (size_t i = 0; i < kMeanTile; ++i) sum[i] /= divisor;
}

void AddInto(float* sum, const float* c, size_t n) {
  size_t lo = 0;
  for (; lo + kMeanTile <= n; lo += kMeanTile) AddTile(sum + lo, c + lo);
  for (size_t i = lo; i < n; ++i) sum[i] += c[i];
}

void DivideByWorkers(float* sum, size_t n, size_t workers) {
  // Dividing by a power of two equals multiplying by its exact reciprocal, bit for bit
  // (both round the same real number once), and multiplying is several times cheaper;
  // other worker counts divide, as the reference check does.
  if (workers == 1) return;
  const bool power_of_two = (workers & (workers - 1)) == 0;
  const float inverse = 1.0f / static_cast<float>(workers), divisor = static_cast<float>(workers);
  size_t lo = 0;
  for (; lo + kMeanTile <= n; lo += kMeanTile) {
    if (power_of_two) {
      MulTile(sum + lo, inverse);
    } else {
      DivTile(sum + lo, divisor);
    }
  }
  for (size_t i = lo; i < n; ++i) sum[i] = power_of_two ? sum[i] * inverse : sum[i] / divisor;
}

}  // namespace

StepAccumulator::StepAccumulator(StepAccumulatorOptions options, cluster::Optimizer optimizer,
                                 Finalizer finalize, WorkerNamer namer)
    : options_(std::move(options)),
      elements_(optimizer.elements()),
      finalize_(std::move(finalize)),
      namer_(std::move(namer)),
      optimizer_(std::move(optimizer)),
      contributions_(options_.workers),
      arrived_(options_.workers, false) {}

StepAccumulator::~StepAccumulator() {
  Lock lock(this);
  EndPendingLocked();
  if (options_.admission != nullptr) options_.admission->ReleaseMemory(buffers_ * buffer_bytes());
  for (Waiter& w : waiters_) {
    ready_.emplace_back(std::move(w.done), absl::UnavailableError(absl::StrCat(
                                               options_.label, " is gone")));
  }
  waiters_.clear();
}

StepAccumulator::Lock::~Lock() {
  std::vector<std::pair<Done, absl::StatusOr<Outcome>>> ready = std::move(acc_->ready_);
  acc_->ready_.clear();
  acc_->mu_.Unlock();
  for (auto& [done, outcome] : ready) std::move(done)(std::move(outcome));
}

absl::Status StepAccumulator::CheckStepLocked(int64_t step) const {
  if (!cancelled_.ok()) return cancelled_;
  if (step < 0 || step >= kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " for ", options_.label,
                                                   " out of range [0, 2^62)"));
  }
  if (!started_) return absl::OkStatus();
  if (step == completed_step_) return absl::OkStatus();
  if (step < current_step_) return StaleLocked(step);
  if (step > current_step_) {
    return absl::FailedPreconditionError(absl::StrCat("future step ", step, " for ",
                                                      options_.label, ": the shard is at step ",
                                                      current_step_));
  }
  return absl::OkStatus();
}

absl::Status StepAccumulator::StaleLocked(int64_t step) const {
  // Most often a worker process restarted its step count, or a second job reuses these
  // shards and keys; the shard cannot tell which, so the message names both.
  return absl::FailedPreconditionError(absl::StrCat(
      "stale step ", step, " for ", options_.label, ": the shard is at step ", current_step_,
      " (a worker that restarted must go on from the shard's step; a new job needs its own "
      "shards, restarted shards or other tensor keys)"));
}

void StepAccumulator::ExpireLocked() {
  // A step times out when a waiting push notices; a push whose call ended before that (a
  // short deadline, a client gone) leaves nobody waiting, and the step would stay pending
  // for good, refusing every other step as stale or future. The next push to arrive
  // notices instead, or the shard's sweep (ExpireIfDue) when pending steps pile up.
  if (arrived_count_ > 0 && absl::Now() >= step_deadline_) FailLocked(TimedOutLocked());
}

bool StepAccumulator::DropPendingOf(uint32_t worker, const absl::Status& status) {
  Lock lock(this);
  ExpireLocked();
  if (worker >= options_.workers || arrived_count_ == 0 || !arrived_[worker]) return false;
  FailLocked(status);
  return true;
}

void StepAccumulator::ExpireIfDue() {
  Lock lock(this);
  ExpireLocked();
}

absl::Status StepAccumulator::TimedOutLocked() const {
  return absl::DeadlineExceededError(absl::StrCat(
      "step ", current_step_, " of ", options_.label, " timed out after ",
      absl::ToInt64Milliseconds(options_.step_timeout), " ms; missing workers: ", MissingLocked(),
      " (every worker must push every key each step: check that they run, and that "
      "they train the same model, since one of another shape pushes other keys)"));
}

absl::StatusOr<bool> StepAccumulator::Admit(uint32_t worker, int64_t step) {
  Lock lock(this);
  ExpireLocked();
  absl::Status s = CheckStepLocked(step);
  if (!s.ok()) return s;
  if (!started_) return false;
  return step == completed_step_ || arrived_[worker];
}

std::string StepAccumulator::MissingLocked() const {
  // The list goes into a status every waiting worker receives and the chunk keeps as its
  // last failure; worker names are chosen by peers. So it is bounded: a few names, each
  // clipped, then a count.
  constexpr size_t kListed = 8;
  constexpr size_t kNameBytes = 48;
  std::string out;
  size_t missing = 0;
  for (uint32_t w = 0; w < options_.workers; ++w) {
    if (arrived_[w]) continue;
    if (missing < kListed) {
      absl::StrAppend(&out, missing > 0 ? ", " : "", log::Clip(namer_(w), kNameBytes));
    }
    ++missing;
  }
  if (missing > kListed) {
    absl::StrAppend(&out, " and ", missing - kListed, " more (", missing, " of ", options_.workers,
                    " workers missing)");
  }
  return out;
}

absl::StatusOr<std::vector<float>> StepAccumulator::TakeBuffer() {
  {
    Lock lock(this);
    if (!free_.empty()) {
      std::vector<float> b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
    if (options_.admission != nullptr) {
      absl::Status s = options_.admission->ReserveMemory(
          buffer_bytes(), absl::StrCat("a step buffer for ", options_.label));
      if (!s.ok()) return s;
    }
    ++buffers_;
  }
  return std::vector<float>(elements_);  // outside the lock: a fresh buffer is zero-filled
}

void StepAccumulator::GiveBack(std::vector<float> buffer) {
  Lock lock(this);
  RecycleLocked(std::move(buffer));
}

void StepAccumulator::RecycleLocked(std::vector<float> buffer) {
  if (buffer.size() != elements_ || elements_ == 0) return;  // not one of ours (or empty)
  if (free_.size() <= options_.workers) {
    free_.push_back(std::move(buffer));
    return;
  }
  if (buffers_ == 0) return;  // a caller's own vector (tests), never reserved
  --buffers_;
  if (options_.admission != nullptr) options_.admission->ReleaseMemory(buffer_bytes());
}

void StepAccumulator::EndPendingLocked() {
  if (options_.admission != nullptr && arrived_count_ > 0) {
    options_.admission->RemovePending(true, arrived_count_ * buffer_bytes());
  }
}

void StepAccumulator::ClearContributionsLocked() {
  for (auto& c : contributions_) {
    if (!c.empty()) RecycleLocked(std::move(c));
    c = std::vector<float>();
  }
  folded_ = 0;
}

void StepAccumulator::FoldArrivedLocked() {
  if (folded_ == 0) {
    if (!arrived_[0]) return;
    folded_ = 1;  // worker 0's contribution is the sum's start
  }
  while (folded_ < options_.workers && arrived_[folded_]) {
    std::vector<float>& c = contributions_[folded_];
    AddInto(contributions_[0].data(), c.data(), elements_);
    // Back to free_ now: the next push's decode writes into a buffer that is still warm.
    RecycleLocked(std::move(c));
    c = std::vector<float>();
    ++folded_;
  }
}

void StepAccumulator::FailLocked(absl::Status status) {
  // A peer can make steps fail at will (one chunk pushed with a short deadline, again and
  // again, over thousands of tensors whose keys and worker names it chose): budgeted, and
  // each line cut to a size.
  static log::LineBudget* const budget = new log::LineBudget(20, "failed steps");
  if (budget->Admit()) {
    log::Warn("{}: step {} failed: {}", log::Clip(options_.label), current_step_,
              log::Clip(status.ToString(), 600));
  }
  last_failure_ = std::move(status);
  EndPendingLocked();
  ClearContributionsLocked();
  arrived_.assign(options_.workers, false);
  arrived_count_ = 0;
  step_deadline_ = absl::InfiniteFuture();
  // A chunk whose first step never completed has no step of its own yet: the next push may
  // start it at any step again, so that one stray push (a step far ahead, a worker of
  // another run) cannot pin a new chunk to a step the job never reaches.
  if (completed_step_ < 0) started_ = false;
  ++attempt_;
  ++steps_failed_;
  if (options_.on_step_failed) options_.on_step_failed();
  WakeLocked();
}

void StepAccumulator::FinishLocked() {
  const absl::Time last_push = absl::Now();
  FoldArrivedLocked();  // every push is in: this folds them all
  std::vector<float>& sum = contributions_[0];
  DivideByWorkers(sum.data(), elements_, options_.workers);
  optimizer_.Step(&sum);  // kNone: the sum becomes the value; its old buffer is recycled
  const absl::Time reduced = absl::Now();
  absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> reply =
      finalize_(current_step_, optimizer_.value());
  const absl::Time encoded = absl::Now();
  if (!reply.ok()) {
    FailLocked(absl::InternalError(absl::StrCat("encoding the result of ", options_.label,
                                                " failed: ", reply.status().message())));
    return;
  }
  result_ = *std::move(reply);
  completed_step_ = current_step_;
  ++current_step_;
  EndPendingLocked();
  ClearContributionsLocked();
  arrived_.assign(options_.workers, false);
  arrived_count_ = 0;
  step_deadline_ = absl::InfiniteFuture();
  ++steps_completed_;
  needs_replication_ = options_.replicate != nullptr;
  if (options_.snapshot_every_steps > 0 && options_.on_snapshot &&
      (completed_step_ + 1) % options_.snapshot_every_steps == 0) {
    options_.on_snapshot(SnapshotLocked());
  }
  if (options_.on_step_completed) {
    options_.on_step_completed(StepTimings{encoded - step_started_, last_push - step_started_,
                                           reduced - last_push, encoded - reduced,
                                           completed_step_});
  }
  WakeLocked();
}

void StepAccumulator::WaitLocked(int64_t step, bool duplicate, Waiter* w) const {
  w->step = step;
  w->duplicate = duplicate;
  w->attempt = attempt_;
  w->replicate_failures = replicate_failures_;
}

std::optional<absl::StatusOr<StepAccumulator::Outcome>> StepAccumulator::EnterLocked(
    uint32_t worker, int64_t step, std::vector<float> contribution, Waiter* w) {
  ExpireLocked();
  absl::Status s = CheckStepLocked(step);
  if (!s.ok()) {
    RecycleLocked(std::move(contribution));
    return s;
  }
  if (started_ && step == completed_step_) {
    // A resend of a completed step: answered from its result once that is replicated
    // (ResolveLocked), which may mean calling the backups.
    RecycleLocked(std::move(contribution));
    WaitLocked(step, /*duplicate=*/true, w);
    return std::nullopt;
  }
  const bool duplicate = started_ && arrived_[worker];
  if (duplicate) RecycleLocked(std::move(contribution));
  if (!duplicate && contribution.empty() && !last_failure_.ok()) {
    // Admitted as a duplicate (so not decoded), but the step failed in between (it timed
    // out): the caller resends, as a waiter of the step would after that failure.
    return last_failure_;
  }
  if (!duplicate) {
    if (const size_t size = contribution.size(); size != elements_) {
      RecycleLocked(std::move(contribution));
      return absl::InvalidArgumentError(absl::StrCat("contribution of ", size, " elements to ",
                                                     options_.label, " of ", elements_));
    }
    // Admission last: past it nothing can fail, so a refused push leaves no trace.
    if (options_.admission != nullptr) {
      absl::Status admitted = options_.admission->AddPending(
          arrived_count_ == 0, buffer_bytes(),
          absl::StrCat("a push of step ", step, " to ", options_.label));
      if (!admitted.ok()) {
        RecycleLocked(std::move(contribution));
        return admitted;
      }
    }
    if (!started_) {
      started_ = true;
      current_step_ = step;
    }
    if (arrived_count_ == 0) {
      step_started_ = absl::Now();
      step_deadline_ = step_started_ + options_.step_timeout;
    }
    contributions_[worker] = std::move(contribution);
    arrived_[worker] = true;
    ++arrived_count_;
    // The last push's additions belong to the step's end (FinishLocked times them).
    if (arrived_count_ == options_.workers) {
      FinishLocked();
    } else {
      FoldArrivedLocked();
    }
  }
  WaitLocked(step, duplicate, w);
  return std::nullopt;
}

std::optional<absl::StatusOr<StepAccumulator::Outcome>> StepAccumulator::ResolveLocked(
    const Waiter& w, bool replicate, bool timers) {
  if (completed_step_ == w.step) {
    if (replicate) {
      if (absl::Status r = EnsureReplicatedLocked(w.deadline); !r.ok()) return r;
      if (completed_step_ != w.step) return StaleLocked(w.step);  // a peer pushed ahead meanwhile
    } else if (needs_replication_) {
      // The push that completed it (or a resend) replicates it, then wakes this wait.
      if (replicate_failures_ != w.replicate_failures) return replicate_failure_;
      if (!cancelled_.ok()) return cancelled_;
      if (timers && absl::Now() >= w.deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "call deadline passed waiting for the backups of ", options_.label, " (step ",
            completed_step_, ")"));
      }
      return std::nullopt;
    }
    return Outcome{result_, w.duplicate};
  }
  if (!cancelled_.ok()) return cancelled_;
  if (attempt_ != w.attempt) return last_failure_;
  if (!timers) return std::nullopt;
  if (absl::Now() >= w.deadline) {
    return absl::DeadlineExceededError(absl::StrCat("call deadline passed waiting for step ",
                                                    w.step, " of ", options_.label,
                                                    "; missing workers: ", MissingLocked()));
  }
  if (w.check) {
    if (absl::Status c = w.check(); !c.ok()) return c;
  }
  return std::nullopt;
}

void StepAccumulator::WakeLocked(bool timers) {
  cv_.SignalAll();
  for (size_t i = 0; i < waiters_.size();) {
    std::optional<absl::StatusOr<Outcome>> r = ResolveLocked(waiters_[i], false, timers);
    if (!r.has_value()) {
      ++i;
      continue;
    }
    ready_.emplace_back(std::move(waiters_[i].done), *std::move(r));
    waiters_[i] = std::move(waiters_.back());
    waiters_.pop_back();
  }
  waiting_.store(waiters_.size(), std::memory_order_relaxed);
}

absl::StatusOr<StepAccumulator::Outcome> StepAccumulator::Push(uint32_t worker, int64_t step,
                                                               std::vector<float> contribution,
                                                               absl::Time deadline,
                                                               const CallCheck& check) {
  Lock lock(this);
  Waiter w;
  w.deadline = deadline;
  w.check = check;
  if (auto r = EnterLocked(worker, step, std::move(contribution), &w)) return *std::move(r);
  while (true) {
    ExpireLocked();  // the step's own timeout
    if (auto r = ResolveLocked(w, /*replicate=*/true, /*timers=*/true)) return *std::move(r);
    absl::Time wake = std::min(deadline, step_deadline_);
    if (check) wake = std::min(wake, absl::Now() + kCallCheckEvery);
    cv_.WaitWithDeadline(&mu_, wake);
  }
}

void StepAccumulator::PushAsync(uint32_t worker, int64_t step, std::vector<float> contribution,
                                absl::Time deadline, CallCheck check, Done done,
                                Blocking blocking) {
  Lock lock(this);
  Waiter w;
  w.deadline = deadline;
  w.check = std::move(check);
  std::optional<absl::StatusOr<Outcome>> r =
      EnterLocked(worker, step, std::move(contribution), &w);
  if (!r.has_value() && completed_step_ == w.step && needs_replication_ && blocking != nullptr) {
    if (!replicating_ && !replication_queued_) {
      // One replication per chunk at a time; the pushes that come meanwhile wait for it
      // without a thread.
      replication_queued_ = true;
      w.done = std::move(done);
      std::move(blocking)([this, w = std::move(w)]() mutable {
        Lock lock(this);
        replication_queued_ = false;
        absl::StatusOr<Outcome> answer =
            completed_step_ == w.step ? *ResolveLocked(w, /*replicate=*/true, /*timers=*/false)
                                      : StaleLocked(w.step);  // a peer pushed ahead meanwhile
        ready_.emplace_back(std::move(w.done), std::move(answer));
      });
      return;
    }
    r = ResolveLocked(w, /*replicate=*/false, /*timers=*/false);
  } else if (!r.has_value()) {
    // Without `blocking`, the push that completed the step replicates it here, before any
    // waiter is answered.
    r = ResolveLocked(w, /*replicate=*/true, /*timers=*/false);
  }
  if (r.has_value()) {
    ready_.emplace_back(std::move(done), *std::move(r));
    return;
  }
  w.done = std::move(done);
  waiters_.push_back(std::move(w));
  waiting_.store(waiters_.size(), std::memory_order_relaxed);
}

void StepAccumulator::Sweep() {
  Lock lock(this);
  ExpireLocked();
  WakeLocked(/*timers=*/true);
}

absl::Status StepAccumulator::EnsureReplicatedLocked(absl::Time deadline) {
  const uint64_t failures = replicate_failures_;
  while (needs_replication_) {
    if (!replicating_) {
      replicating_ = true;
      const ChunkSnapshot snap = SnapshotLocked();
      mu_.Unlock();
      absl::Status s = options_.replicate(snap);
      mu_.Lock();
      replicating_ = false;
      // State completed meanwhile (only a peer pushing ahead can do that) needs another round.
      if (s.ok() && completed_step_ == snap.completed_step) needs_replication_ = false;
      if (!s.ok()) {
        replicate_failure_ = s;
        ++replicate_failures_;
      }
      WakeLocked();
      if (!s.ok()) return s;
      continue;
    }
    if (replicate_failures_ != failures) return replicate_failure_;
    if (!cancelled_.ok()) return cancelled_;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "call deadline passed waiting for the backups of ", options_.label, " (step ",
          completed_step_, ")"));
    }
    cv_.WaitWithDeadline(&mu_, deadline);
  }
  return absl::OkStatus();
}

void StepAccumulator::RequireReplication() {
  Lock lock(this);
  if (options_.replicate != nullptr) needs_replication_ = true;
}

absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> StepAccumulator::Current() {
  Lock lock(this);
  if (absl::Status r = EnsureReplicatedLocked(absl::Now() + options_.step_timeout); !r.ok()) {
    return r;
  }
  if (result_ != nullptr) return result_;
  return finalize_(completed_step_, optimizer_.value());
}

bool StepAccumulator::SetInitial(absl::Span<const float> value) {
  Lock lock(this);
  if (started_ || completed_step_ >= 0) return false;
  optimizer_.SetValue(value);
  return true;
}

ChunkSnapshot StepAccumulator::SnapshotLocked() const {
  ChunkSnapshot snap;
  snap.started = started_;
  snap.current_step = current_step_;
  snap.completed_step = completed_step_;
  snap.optimizer = optimizer_.state();
  snap.cached_result = result_;
  return snap;
}

ChunkSnapshot StepAccumulator::Snapshot() const {
  absl::ReaderMutexLock lock(&mu_);
  return SnapshotLocked();
}

StepProgress StepAccumulator::Progress() const {
  absl::ReaderMutexLock lock(&mu_);
  return StepProgress{started_, current_step_, completed_step_, arrived_count_ > 0,
                      needs_replication_};
}

absl::Status StepAccumulator::CheckSnapshot(const ChunkSnapshot& snap,
                                            const cluster::OptimizerOptions& optimizer,
                                            size_t elements, absl::string_view label) {
  // A chunk that completed step 2^62 - 1, the last a push may name, is at step 2^62.
  if (snap.current_step < 0 || snap.current_step > kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("restored step ", snap.current_step, " for ",
                                                   label, " out of range [0, 2^62]"));
  }
  if (snap.completed_step != -1 && snap.completed_step != snap.current_step - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("restored state of ", label, " has completed step ", snap.completed_step,
                     " but step ", snap.current_step, " in progress"));
  }
  if (!snap.started && (snap.completed_step != -1 || snap.current_step != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("restored state of ", label, " has steps but is not started"));
  }
  if ((snap.completed_step >= 0) != (snap.cached_result != nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("restored state of ", label,
                                                   snap.completed_step >= 0
                                                       ? " lacks the result of its completed step"
                                                       : " has a result but no completed step"));
  }
  if (absl::Status s = cluster::Optimizer::CheckState(optimizer, elements, snap.optimizer);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("restored state of ", label, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status StepAccumulator::Restore(ChunkSnapshot snap) {
  Lock lock(this);
  if (absl::Status s = CheckSnapshot(snap, optimizer_.options(), elements_, options_.label);
      !s.ok()) {
    return s;
  }
  if (started_ || completed_step_ >= 0 || arrived_count_ > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot restore ", options_.label, ": it has already taken pushes"));
  }
  absl::Status s = optimizer_.Restore(std::move(snap.optimizer));
  if (!s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("restored state of ", options_.label, ": ", s.message()));
  }
  started_ = snap.started;
  current_step_ = snap.current_step;
  completed_step_ = snap.completed_step;
  result_ = std::move(snap.cached_result);
  // A promoted backup's state must reach the chunk's new backups before any answer.
  needs_replication_ = options_.replicate != nullptr;
  return absl::OkStatus();
}

void StepAccumulator::Cancel(const absl::Status& status) {
  Lock lock(this);
  cancelled_ = status;
  WakeLocked();
}

uint64_t StepAccumulator::steps_completed() const {
  absl::ReaderMutexLock lock(&mu_);
  return steps_completed_;
}

uint64_t StepAccumulator::steps_failed() const {
  absl::ReaderMutexLock lock(&mu_);
  return steps_failed_;
}

}  // namespace gcomp::server
