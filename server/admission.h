// Shard-wide admission of what clients make a shard hold (docs/SERVICE.md, "Limits").
// Thread-safe; one instance per shard, borrowed by every chunk's StepAccumulator.
//
// Memory: every byte a declaration or a push makes the shard keep is reserved here
// *before* it is allocated (chunk values, optimizer state, cached results, step buffers,
// and later migration/replication buffers). A reservation that would pass the budget is
// refused with ResourceExhausted naming the budget, what is in use and what was asked;
// nothing is reserved then, so the refused request leaves no trace.
//
// Pending steps: a chunk whose step holds some but not all of its W pushes is pending; the
// count of such chunks and the decoded bytes their pushes hold are bounded separately, so
// pushes that will never be completed (a hostile or broken worker pushing ahead) cannot
// take the whole budget.
#ifndef GCOMP_SERVER_ADMISSION_H_
#define GCOMP_SERVER_ADMISSION_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gcomp::server {

struct AdmissionLimits {
  uint64_t memory_budget_bytes = uint64_t{1} << 30;
  uint64_t max_pending_steps = 65536;
  // 0: pending bytes are bounded by the memory budget only.
  uint64_t max_pending_bytes = 0;
};

struct AdmissionUsage {
  uint64_t memory_bytes = 0;
  uint64_t pending_steps = 0;
  uint64_t pending_bytes = 0;
  uint64_t refused = 0;  // requests refused by any limit here
};

class Admission {
 public:
  explicit Admission(const AdmissionLimits& limits) : limits_(limits) {}
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Reserves `bytes` for `what` (e.g. "declaring 'w' (3 chunks here)"), or
  // ResourceExhausted naming limits.memory_budget_bytes.
  absl::Status ReserveMemory(uint64_t bytes, absl::string_view what);
  void ReleaseMemory(uint64_t bytes);
  // Whether `bytes` more would fit now, with ReserveMemory's refusal (counted as one) when
  // not; reserves nothing.
  absl::Status CheckMemory(uint64_t bytes, absl::string_view what);

  // Admits a push of `bytes` decoded bytes to a pending step; `starts_step` when it is the
  // step's first push (the chunk becomes pending). ResourceExhausted naming
  // limits.max_pending_steps or limits.max_pending_bytes, with nothing counted.
  absl::Status AddPending(bool starts_step, uint64_t bytes, absl::string_view what);
  // Undoes AddPending for `bytes`; `ends_step` when the chunk stops being pending.
  void RemovePending(bool ends_step, uint64_t bytes);

  // Counts a request refused by a limit checked elsewhere (e.g. limits.max_tensors).
  void CountRefusal();

  AdmissionUsage usage() const;
  const AdmissionLimits& limits() const { return limits_; }

 private:
  const AdmissionLimits limits_;  // constant after construction

  // ReserveMemory's refusal when `bytes` more do not fit (counted), else OK.
  absl::Status FitsLocked(uint64_t bytes, absl::string_view what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  AdmissionUsage usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_ADMISSION_H_
