#include "base/progress_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, progress, "auto",
          "auto|always|never: a progress line (step, steps/s, ratio, ETA) rewritten on stderr; "
          "auto shows it only when stderr is a terminal.");

namespace gcomp {

absl::StatusOr<ProgressMode> ProgressModeFromFlags() {
  return ParseProgressMode(absl::GetFlag(FLAGS_progress));
}

}  // namespace gcomp
