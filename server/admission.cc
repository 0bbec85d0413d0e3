#include "server/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/logging.h"

namespace gcomp::server {

absl::Status Admission::FitsLocked(uint64_t bytes, absl::string_view what) {
  if (bytes > limits_.memory_budget_bytes - usage_.memory_bytes) {
    ++usage_.refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "shard memory budget exceeded (limits.memory_budget_bytes = ",
        limits_.memory_budget_bytes, "): ", usage_.memory_bytes, " bytes in use, ", what,
        " asks for ", bytes, " more"));
  }
  return absl::OkStatus();
}

absl::Status Admission::ReserveMemory(uint64_t bytes, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  if (absl::Status fits = FitsLocked(bytes, what); !fits.ok()) return fits;
  usage_.memory_bytes += bytes;
  return absl::OkStatus();
}

absl::Status Admission::CheckMemory(uint64_t bytes, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  return FitsLocked(bytes, what);
}

void Admission::ReleaseMemory(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes > usage_.memory_bytes) {
    log::Error("admission: releasing {} bytes of {} reserved", bytes, usage_.memory_bytes);
    bytes = usage_.memory_bytes;
  }
  usage_.memory_bytes -= bytes;
}

absl::Status Admission::AddPending(bool starts_step, uint64_t bytes, absl::string_view what) {
  absl::MutexLock lock(&mu_);
  if (starts_step && usage_.pending_steps >= limits_.max_pending_steps) {
    ++usage_.refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "too many pending steps (limits.max_pending_steps = ", limits_.max_pending_steps,
        "): ", usage_.pending_steps, " chunks wait for pushes of other workers; ", what,
        " would start another"));
  }
  if (limits_.max_pending_bytes != 0 &&
      bytes > limits_.max_pending_bytes - usage_.pending_bytes) {
    ++usage_.refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "pending pushes hold too many bytes (limits.max_pending_bytes = ",
        limits_.max_pending_bytes, "): ", usage_.pending_bytes, " bytes held, ", what,
        " adds ", bytes));
  }
  if (starts_step) ++usage_.pending_steps;
  usage_.pending_bytes += bytes;
  return absl::OkStatus();
}

void Admission::RemovePending(bool ends_step, uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (ends_step && usage_.pending_steps > 0) --usage_.pending_steps;
  usage_.pending_bytes -= std::min(bytes, usage_.pending_bytes);
}

void Admission::CountRefusal() {
  absl::MutexLock lock(&mu_);
  ++usage_.refused;
}

AdmissionUsage Admission::usage() const {
  absl::MutexLock lock(&mu_);
  return usage_;
}

}  // namespace gcomp::server
