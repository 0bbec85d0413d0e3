#include "base/build_info.h"

#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"
#include "base/build_info_stamp.inc"

namespace gcomp {

BuildInfo GetBuildInfo() { return {GCOMP_VERSION, GCOMP_REVISION}; }

std::string VersionLine(absl::string_view program) {
  return absl::StrCat(program, " ", GCOMP_VERSION, " (revision ", GCOMP_REVISION, ")");
}

void InstallVersionFlag(absl::string_view program) {
  absl::FlagsUsageConfig config;
  // Abseil keeps the function; the program name must outlive this call.
  config.version_string = [name = std::string(program)] { return VersionLine(name) + "\n"; };
  absl::SetFlagsUsageConfig(config);
}

}  // namespace gcomp
