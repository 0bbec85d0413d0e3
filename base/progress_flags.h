// --progress (auto|always|never), the flag of every program that draws a progress line,
// defined once here. A binary gets it by depending on this target; its main() calls
// ProgressModeFromFlags after absl::ParseCommandLine (the only place that reads it).
#ifndef GCOMP_BASE_PROGRESS_FLAGS_H_
#define GCOMP_BASE_PROGRESS_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "base/progress.h"

ABSL_DECLARE_FLAG(std::string, progress);

namespace gcomp {

// --progress parsed; ParseProgressMode's InvalidArgument for anything else.
absl::StatusOr<ProgressMode> ProgressModeFromFlags();

}  // namespace gcomp

#endif  // GCOMP_BASE_PROGRESS_FLAGS_H_
