// Process-wide allocator settings for programs that move megabyte-sized buffers.
#ifndef GCOMP_BASE_MALLOC_TUNING_H_
#define GCOMP_BASE_MALLOC_TUNING_H_

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace gcomp {

// Keeps freed multi-megabyte buffers (gRPC messages, decoded chunks) in the heap instead of
// returning them to the kernel: by default glibc mmaps each such block and trims thread
// arenas with madvise, so every chunk of every step paid page faults and zero-filling again
// (measured: a 4-worker, 2-shard step on loopback took 1.8x longer). Call once at the top
// of main(); costs memory that the process has already used once.
void TuneMallocForLargeBuffers();

// Hands the heap's free pages back to the kernel (malloc_trim) every `interval` on a
// thread of its own, until destroyed. With the settings above nothing is ever trimmed, so
// free holes left as buffer sizes drift would stay resident for good; one trim every few
// seconds keeps resident memory close to what is in use, and the page faults it costs are
// paid once per interval, not per step. (docs/BENCHMARKS.md, "Steady state", has what the
// 10,000-step soak run measured with and without it.)
class PeriodicMallocTrim {
 public:
  explicit PeriodicMallocTrim(absl::Duration interval);
  ~PeriodicMallocTrim();
  PeriodicMallocTrim(const PeriodicMallocTrim&) = delete;
  PeriodicMallocTrim& operator=(const PeriodicMallocTrim&) = delete;

 private:
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace gcomp

#endif  // GCOMP_BASE_MALLOC_TUNING_H_
