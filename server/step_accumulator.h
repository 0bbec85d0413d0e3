// Step-fenced aggregation of one (key, chunk): sums the W workers' contributions of a
// step, averages, applies the chunk's optimizer, encodes the result once and answers
// every worker. Thread-safe; one instance per owned chunk.
//
// Idempotence: a worker's second push for the step in progress adds nothing and waits for
// the same result; a push for the step just completed gets the cached result. A push for
// an older step, or a step beyond the one in progress, is FailedPrecondition and changes
// nothing.
//
// Deadlines: the step times out step_timeout after its first contribution; every waiter
// then gets DeadlineExceeded naming the missing workers and the contributions are dropped
// (the step may be pushed again). With no push waiting, the next push to arrive ends it. A
// caller whose own deadline passes first gets DeadlineExceeded, but its contribution stays
// (a retry is a duplicate).
//
// Admission (optional, shard-wide): step buffers are reserved against the memory budget
// before they are allocated, and a push that starts or adds to a pending step is counted
// against the pending limits; a push refused there gets ResourceExhausted and leaves the
// chunk exactly as it was.
#ifndef GCOMP_SERVER_STEP_ACCUMULATOR_H_
#define GCOMP_SERVER_STEP_ACCUMULATOR_H_

#include <cstdint>
#include <functional>
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/block.pb.h"
#include "cluster/optimizer.h"
#include "server/admission.h"

namespace gcomp::server {

// Where a completed chunk-step's time went (for metrics).
struct StepTimings {
  absl::Duration total;           // first push to result
  absl::Duration straggler_wait;  // first push to the last worker's push
  absl::Duration reduce;          // sum, mean and optimizer
  absl::Duration encode;          // encoding the result
  int64_t step = -1;              // the step completed
};

// A chunk's state as of its last completed step: what checkpoints record and re-sharding
// moves (server/chunk_state.h serializes it). Pushes of the step in progress are not part
// of it (workers resend them).
struct ChunkSnapshot {
  bool started = false;        // a first push fixed the starting step
  int64_t current_step = 0;    // the step in progress
  int64_t completed_step = -1; // -1: none
  cluster::OptimizerState optimizer;
  // The reply to completed_step (null when none completed).
  std::shared_ptr<const proto::CompressedBlock> cached_result;
};

// Where a chunk's steps stand, without copying its state.
struct StepProgress {
  bool started = false;
  int64_t current_step = 0;     // the step in progress, or the next one
  int64_t completed_step = -1;  // -1: none
  bool pending = false;         // contributions of current_step have arrived
  // With replication: the state is not yet on the backups, so completed_step's result has
  // not been given to any worker yet.
  bool unreplicated = false;
};

struct StepAccumulatorOptions {
  uint32_t workers = 1;
  absl::Duration step_timeout = absl::Seconds(10);
  // Names the chunk in errors, e.g. "key 'w' chunk 3".
  std::string label;
  // Shard-wide limits; null: none. Borrowed: must outlive the accumulator.
  Admission* admission = nullptr;
  // Called (under the accumulator's lock: keep it cheap) when a step completes or fails.
  std::function<void(const StepTimings&)> on_step_completed;
  std::function<void()> on_step_failed;
  // With snapshot_every_steps > 0: called (under the lock) with the chunk's snapshot right
  // after it completes a step s with (s + 1) % snapshot_every_steps == 0.
  int64_t snapshot_every_steps = 0;
  std::function<void(ChunkSnapshot)> on_snapshot;
  // With replicas (docs/SERVICE.md, "Replication and failover"): called, outside the
  // lock and by one of the step's pushers, with the chunk's state after a completed step
  // (and after Restore or RequireReplication). No worker gets the step's result before it
  // returned OK; its error goes to the waiting pushers, and a resent push tries again.
  std::function<absl::Status(const ChunkSnapshot&)> replicate;
};

// Step numbers run from 0 to below this bound; a larger one is refused (the step after it
// must be representable, and no training runs 2^62 steps).
inline constexpr int64_t kMaxStep = int64_t{1} << 62;

// One chunk's steps: collects each worker's decoded push of a step, and when all W are in,
// takes their mean, applies the optimizer and encodes the reply every pusher gets.
//
// The mean of element i is ((c[0][i] + c[1][i]) + c[2][i]) + ..., in worker order whatever
// order the pushes arrive in, then divided by W (multiplied by its reciprocal when W is a
// power of two: the same result bit for bit), so lossless aggregation is reproducible bit
// for bit. The reference check and the replicas repeat exactly these operations, so their
// order is part of the contract.
class StepAccumulator {
 public:
  // Encodes the chunk's value (mean gradient or parameters) after `step` into a reply.
  using Finalizer = std::function<absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>>(
      int64_t step, absl::Span<const float> value)>;
  // The name of worker w for error messages.
  using WorkerNamer = std::function<std::string(uint32_t worker)>;

  struct Outcome {
    std::shared_ptr<const proto::CompressedBlock> reply;
    bool duplicate = false;
  };

  StepAccumulator(StepAccumulatorOptions options, cluster::Optimizer optimizer, Finalizer finalize,
                  WorkerNamer namer);
  ~StepAccumulator();
  StepAccumulator(const StepAccumulator&) = delete;
  StepAccumulator& operator=(const StepAccumulator&) = delete;

  // Whether a push of (worker, step) would be accepted: true when it is a duplicate (the
  // caller need not decode it), false when new; FailedPrecondition if stale or future.
  absl::StatusOr<bool> Admit(uint32_t worker, int64_t step);

  // A buffer of elements() floats to decode a contribution into. Buffers are recycled
  // across steps (after warm-up a push allocates and zero-fills nothing), so the contents
  // are unspecified: the caller overwrites every element. A new buffer is first reserved
  // against the memory budget (ResourceExhausted if it does not fit). Give it back through
  // Push or GiveBack; a dropped buffer keeps its reservation.
  absl::StatusOr<std::vector<float>> TakeBuffer();
  // Returns a buffer from TakeBuffer that will not be pushed (e.g. its block was corrupt).
  void GiveBack(std::vector<float> buffer);

  // Fails the current step if it timed out with nobody left waiting for it (otherwise the
  // next push to this chunk notices). Frees its pending-step slot.
  void ExpireIfDue();

  // Whether the call that pushed may go on waiting; an error ends its wait with that error
  // (the contribution stays, as when the call's deadline passes). Cheap, and called under
  // the accumulator's lock: it must take no lock that is held while taking that one.
  using CallCheck = std::function<absl::Status()>;
  // How often a waiting push with a CallCheck wakes to call it.
  static constexpr absl::Duration kCallCheckEvery = absl::Milliseconds(500);

  // Contributes (contribution.size() == elements(), or empty for a duplicate) and waits
  // until the step completes, fails, or `deadline` passes; with `check`, also until it
  // returns an error (called every kCallCheckEvery). The contribution's buffer is kept for
  // reuse whatever the outcome.
  absl::StatusOr<Outcome> Push(uint32_t worker, int64_t step, std::vector<float> contribution,
                               absl::Time deadline, const CallCheck& check = nullptr);

  // Push without a thread waiting: `done` gets what Push would return, exactly once,
  // outside the lock, on the thread that ends the wait: this one, the step's last pusher
  // (after it replicated: on `blocking`), a failure or Cancel, or Sweep for deadlines and
  // checks.
  using Done = absl::AnyInvocable<void(absl::StatusOr<Outcome>) &&>;
  // Runs `work` later on a thread that may block; the caller keeps the accumulator alive
  // until it has run.
  using Work = absl::AnyInvocable<void() &&>;
  using Blocking = absl::AnyInvocable<void(Work) &&>;
  // A completed step that must reach the backups first is replicated on `blocking` (a call
  // to peers that a dead backup holds for its whole deadline), never on this thread: the
  // caller's is a small pool whose other pushes must not wait behind it. Without
  // `blocking`, replicates here.
  void PushAsync(uint32_t worker, int64_t step, std::vector<float> contribution,
                 absl::Time deadline, CallCheck check, Done done, Blocking blocking = nullptr);
  // Ends the PushAsync waits whose deadline passed, whose check fails or whose step timed
  // out; call it every so often (it is what Push's own timed wake does).
  void Sweep();
  bool has_waiters() const { return waiting_.load(std::memory_order_relaxed) > 0; }

  // The current value encoded (before any step: the initial value) and its step (-1 if none).
  absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> Current();

  // Sets the initial value if no step has started; returns whether it was applied.
  bool SetInitial(absl::Span<const float> value);

  // The state as of the last completed step (a copy; steps continue).
  ChunkSnapshot Snapshot() const;
  StepProgress Progress() const;
  // Replaces the state with `snapshot` (a restored checkpoint or a moved chunk). Only
  // before any push: FailedPrecondition otherwise; InvalidArgument (nothing changed) when
  // the snapshot is inconsistent (steps, sizes, a completed step without its result).
  absl::Status Restore(ChunkSnapshot snapshot);
  // Restore's checks of the snapshot alone (steps, the result, the optimizer state), for a
  // chunk of `elements` with `optimizer`; `label` names it in the error.
  static absl::Status CheckSnapshot(const ChunkSnapshot& snapshot,
                                    const cluster::OptimizerOptions& optimizer, size_t elements,
                                    absl::string_view label);

  // Fails the pending step with `status` if `worker` has pushed to it; whether it did. For
  // a new process that took the worker's index over (a restart): the push of the process
  // it replaced holds another gradient, and must not be averaged in. The step's other
  // pushers get `status` and push again; so does the new process.
  bool DropPendingOf(uint32_t worker, const absl::Status& status);

  // Ends every wait with `status` and refuses later pushes with it.
  void Cancel(const absl::Status& status);

  // With options.replicate: the current state is sent again before the next answer (the
  // chunk's backups changed).
  void RequireReplication();

  size_t elements() const { return elements_; }
  uint64_t steps_completed() const;
  uint64_t steps_failed() const;

 private:
  // mu_, and on release the Done of every wait that ended meanwhile (outside the lock).
  class ABSL_SCOPED_LOCKABLE Lock {
   public:
    explicit Lock(StepAccumulator* acc) ABSL_EXCLUSIVE_LOCK_FUNCTION(acc->mu_) : acc_(acc) {
      acc_->mu_.Lock();
    }
    ~Lock() ABSL_UNLOCK_FUNCTION();

   private:
    StepAccumulator* const acc_;
  };
  // One push waiting for its step.
  struct Waiter {
    int64_t step = 0;
    bool duplicate = false;
    uint64_t attempt = 0;
    uint64_t replicate_failures = 0;
    absl::Time deadline;
    CallCheck check;
    Done done;
  };
  // Push up to its wait: the answer, or nullopt when `w` must wait (w filled in).
  std::optional<absl::StatusOr<Outcome>> EnterLocked(uint32_t worker, int64_t step,
                                                     std::vector<float> contribution, Waiter* w)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fills `w` for a wait on `step` as things stand now (attempt, replication failures).
  void WaitLocked(int64_t step, bool duplicate, Waiter* w) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The answer to `w` if its wait is over. With `replicate`, this thread replicates a
  // completed step (or waits for the one that does); without, a completed step waits for
  // its replication. `timers`: also `w`'s deadline and check.
  std::optional<absl::StatusOr<Outcome>> ResolveLocked(const Waiter& w, bool replicate,
                                                       bool timers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes Push's waits and ends the PushAsync waits that are over.
  void WakeLocked(bool timers = false) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckStepLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status StaleLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  ChunkSnapshot SnapshotLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Fails the pending step if its timeout has passed (whether or not a push waits on it).
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status TimedOutLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  std::string MissingLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void RecycleLocked(std::vector<float> buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the pending step's admission count (arrived_count_ pushes).
  void EndPendingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t buffer_bytes() const { return elements_ * sizeof(float); }
  // Moves every contribution back to free_.
  void ClearContributionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds each arrived contribution that continues the worker order (1, 2, ... after 0)
  // into contributions_[0] and recycles its buffer, so the sum grows while pushes arrive
  // instead of all at the last push, which adds only what arrived out of order. The same
  // additions in the same order as summing after the last push, so the same bits.
  void FoldArrivedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Until the state is replicated: replicates it (one caller at a time, the lock released
  // meanwhile) or waits for the caller that does. Its error, or Cancel's, or
  // DeadlineExceeded at `deadline`.
  absl::Status EnsureReplicatedLocked(absl::Time deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const StepAccumulatorOptions options_;
  const size_t elements_;
  const Finalizer finalize_;
  const WorkerNamer namer_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  cluster::Optimizer optimizer_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  int64_t current_step_ ABSL_GUARDED_BY(mu_) = 0;
  // contributions_[w] is worker w's decoded push of the step in progress (empty until it
  // arrives); free_ holds buffers of elements_ floats for TakeBuffer, at most W + 1.
  std::vector<std::vector<float>> contributions_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<float>> free_ ABSL_GUARDED_BY(mu_);
  // Buffers of elements_ floats reserved against the budget and not yet released.
  uint64_t buffers_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  uint32_t arrived_count_ ABSL_GUARDED_BY(mu_) = 0;
  // Workers 0 .. folded_ - 1 are summed into contributions_[0] (their buffers recycled).
  uint32_t folded_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time step_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  absl::Time step_started_ ABSL_GUARDED_BY(mu_);  // the step in progress's first push
  int64_t completed_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<const proto::CompressedBlock> result_ ABSL_GUARDED_BY(mu_);
  uint64_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_failure_ ABSL_GUARDED_BY(mu_);
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_failed_ ABSL_GUARDED_BY(mu_) = 0;
  // Replication: the state differs from what the backups last acknowledged.
  bool needs_replication_ ABSL_GUARDED_BY(mu_) = false;
  bool replicating_ ABSL_GUARDED_BY(mu_) = false;
  bool replication_queued_ ABSL_GUARDED_BY(mu_) = false;  // on PushAsync's `blocking`
  uint64_t replicate_failures_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status replicate_failure_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::atomic<size_t> waiting_{0};  // waiters_.size(), read without the lock
  // Ended waits, answered when the lock is released.
  std::vector<std::pair<Done, absl::StatusOr<Outcome>>> ready_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_STEP_ACCUMULATOR_H_
