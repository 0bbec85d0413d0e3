// --log_level and --log_format, the logging flags of every program, defined once here.
// A binary gets them by depending on this target; its main() calls InitLoggingFromFlags
// after absl::ParseCommandLine (the only place that reads them).
#ifndef GCOMP_BASE_LOG_FLAGS_H_
#define GCOMP_BASE_LOG_FLAGS_H_

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"

ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, log_format);

namespace gcomp {

// InitLogging(program, level, format) from the flags; `default_level` where --log_level
// was left empty (each program has its own: a server says more than a tool). Returns
// InitLogging's InvalidArgument for a level or format it does not know.
absl::Status InitLoggingFromFlags(absl::string_view program, absl::string_view default_level);

}  // namespace gcomp

#endif  // GCOMP_BASE_LOG_FLAGS_H_
