#include "base/log_flags.h"

#include "absl/flags/flag.h"
#include "base/logging.h"

ABSL_FLAG(std::string, log_level, "",
          "trace|debug|info|warn|error|off; empty: the program's default (info for "
          "gcomp_server, warn for the others).");
ABSL_FLAG(std::string, log_format, "text",
          "text|json: json writes one JSON object per line (ts, level, process, msg) for log "
          "collectors.");

namespace gcomp {

absl::Status InitLoggingFromFlags(absl::string_view program, absl::string_view default_level) {
  const std::string level = absl::GetFlag(FLAGS_log_level);
  return InitLogging(program, level.empty() ? default_level : absl::string_view(level),
                     absl::GetFlag(FLAGS_log_format));
}

}  // namespace gcomp
