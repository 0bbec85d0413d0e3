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
// (the step may be pushed again). A caller whose own deadline passes first gets
// DeadlineExceeded, but its contribution stays (a retry is a duplicate).
//
// Summation order: contributions are summed in worker-id order in f32, then divided by W,
// independent of arrival order (so lossless aggregation is reproducible bit for bit).
#ifndef GCOMP_SERVER_STEP_ACCUMULATOR_H_
#define GCOMP_SERVER_STEP_ACCUMULATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "proto/block.pb.h"
#include "server/optimizer.h"

namespace gcomp::server {

struct StepAccumulatorOptions {
  uint32_t workers = 1;
  absl::Duration step_timeout = absl::Seconds(10);
  // Names the chunk in errors, e.g. "key 'w' chunk 3".
  std::string label;
};

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

  StepAccumulator(StepAccumulatorOptions options, Optimizer optimizer, Finalizer finalize,
                  WorkerNamer namer);
  StepAccumulator(const StepAccumulator&) = delete;
  StepAccumulator& operator=(const StepAccumulator&) = delete;

  // Whether a push of (worker, step) would be accepted: true when it is a duplicate (the
  // caller need not decode it), false when new; FailedPrecondition if stale or future.
  absl::StatusOr<bool> Admit(uint32_t worker, int64_t step) const;

  // Contributes (contribution.size() == elements(), or empty for a duplicate) and waits
  // until the step completes, fails, or `deadline` passes.
  absl::StatusOr<Outcome> Push(uint32_t worker, int64_t step, std::vector<float> contribution,
                               absl::Time deadline);

  // The current value encoded (before any step: the initial value) and its step (-1 if none).
  absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> Current();

  // Sets the initial value if no step has started; returns whether it was applied.
  bool SetInitial(absl::Span<const float> value);

  // Ends every wait with `status` and refuses later pushes with it.
  void Cancel(const absl::Status& status);

  size_t elements() const { return elements_; }
  uint64_t steps_completed() const;
  uint64_t steps_failed() const;

 private:
  absl::Status CheckStepLocked(int64_t step) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(absl::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string MissingLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const StepAccumulatorOptions options_;
  const size_t elements_;
  const Finalizer finalize_;
  const WorkerNamer namer_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;
  Optimizer optimizer_ ABSL_GUARDED_BY(mu_);
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  int64_t current_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::vector<float>> contributions_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> arrived_ ABSL_GUARDED_BY(mu_);
  uint32_t arrived_count_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time step_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  int64_t completed_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::shared_ptr<const proto::CompressedBlock> result_ ABSL_GUARDED_BY(mu_);
  uint64_t attempt_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status last_failure_ ABSL_GUARDED_BY(mu_);
  absl::Status cancelled_ ABSL_GUARDED_BY(mu_);
  uint64_t steps_completed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steps_failed_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_STEP_ACCUMULATOR_H_
