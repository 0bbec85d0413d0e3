// Resident memory and open file descriptors of a process, from /proc (Linux). Used by the
// soak checks of the local launcher and tests to show that a long run stays flat.
#ifndef GCOMP_BASE_PROCESS_USAGE_H_
#define GCOMP_BASE_PROCESS_USAGE_H_

#include <sys/types.h>

#include <cstdint>

#include "absl/status/statusor.h"

namespace gcomp {

struct ProcessUsage {
  uint64_t rss_bytes = 0;  // VmRSS
  uint64_t open_fds = 0;   // entries of /proc/PID/fd
};

// NotFound when the process is gone or /proc cannot be read.
absl::StatusOr<ProcessUsage> ReadProcessUsage(pid_t pid);

}  // namespace gcomp

#endif  // GCOMP_BASE_PROCESS_USAGE_H_
