#include "base/mutex_mode.h"

#include "absl/synchronization/mutex.h"

namespace gcomp {

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace gcomp
