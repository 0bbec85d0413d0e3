#include "base/process_usage.h"

#include <dirent.h>

#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace gcomp {

absl::StatusOr<ProcessUsage> ReadProcessUsage(pid_t pid) {
  const std::string proc = absl::StrCat("/proc/", pid);
  std::ifstream status(proc + "/status");
  if (!status) return absl::NotFoundError(absl::StrCat("cannot read ", proc, "/status"));
  ProcessUsage usage;
  bool found = false;
  for (std::string line; std::getline(status, line);) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripSuffix(absl::StripAsciiWhitespace(rest), "kB");
    uint64_t kb = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kb)) break;
    usage.rss_bytes = kb * 1024;
    found = true;
    break;
  }
  if (!found) return absl::NotFoundError(absl::StrCat("no VmRSS in ", proc, "/status"));
  DIR* dir = opendir((proc + "/fd").c_str());
  if (dir == nullptr) return absl::NotFoundError(absl::StrCat("cannot list ", proc, "/fd"));
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++usage.open_fds;
  }
  closedir(dir);
  return usage;
}

}  // namespace gcomp
