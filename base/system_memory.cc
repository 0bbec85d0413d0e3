#include "base/system_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"

namespace gcomp {
namespace {

std::optional<std::string> ReadSmallFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return static_cast<uint64_t>(pages) * static_cast<uint64_t>(page);
}

std::optional<uint64_t> ParseCgroupLimit(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  uint64_t v = 0;
  if (text == "max" || !absl::SimpleAtoi(text, &v) || v == 0) return std::nullopt;
  return v;
}

std::optional<uint64_t> CgroupMemoryLimitBytes(const std::string& cgroup_root) {
  for (const char* file : {"/memory.max", "/memory/memory.limit_in_bytes"}) {
    std::optional<std::string> text = ReadSmallFile(cgroup_root + file);
    if (!text) continue;
    std::optional<uint64_t> limit = ParseCgroupLimit(*text);
    // cgroup v1 writes "no limit" as a huge number (0x7ffffffffffff000).
    const uint64_t physical = PhysicalMemoryBytes();
    if (limit && physical > 0 && *limit >= physical) return std::nullopt;
    return limit;
  }
  return std::nullopt;
}

uint64_t AvailableMemoryBytes() {
  const uint64_t physical = PhysicalMemoryBytes();
  const std::optional<uint64_t> cgroup = CgroupMemoryLimitBytes();
  if (!cgroup) return physical;
  return physical == 0 ? *cgroup : std::min(physical, *cgroup);
}

}  // namespace gcomp
