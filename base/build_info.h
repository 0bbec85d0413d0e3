// What a program was built from: the release in //:VERSION and the git revision of the
// tree (tools/workspace_status.sh: "unknown" outside a git checkout, "-dirty" with
// uncommitted changes). Stamped at every build, so only main()s should depend on it.
//
//   gcomp::InstallVersionFlag("gcomp_server");  // before absl::ParseCommandLine
// The metric gcomp_build_info is base/build_info_metric.h (this target loads no Prometheus
// library: the codec CLI links it).
#ifndef GCOMP_BASE_BUILD_INFO_H_
#define GCOMP_BASE_BUILD_INFO_H_

#include <string>

#include "absl/strings/string_view.h"

namespace gcomp {

struct BuildInfo {
  absl::string_view version;   // e.g. "0.1.0"
  absl::string_view revision;  // e.g. "5c50a0b1d2e3", "5c50a0b1d2e3-dirty" or "unknown"
};
BuildInfo GetBuildInfo();

// "gcomp_server 0.1.0 (revision 5c50a0b1d2e3)", what --version prints.
std::string VersionLine(absl::string_view program);

// Makes Abseil's built-in --version flag print VersionLine(program) and exit 0.
void InstallVersionFlag(absl::string_view program);

}  // namespace gcomp

#endif  // GCOMP_BASE_BUILD_INFO_H_
