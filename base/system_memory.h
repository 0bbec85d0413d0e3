// How much memory this process may use: the cgroup limit of its container when there is
// one, else physical memory. Shards derive their default memory budget from it.
#ifndef GCOMP_BASE_SYSTEM_MEMORY_H_
#define GCOMP_BASE_SYSTEM_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace gcomp {

// Physical memory of the machine (sysconf), in bytes.
uint64_t PhysicalMemoryBytes();

// The memory limit of this process's cgroup: `memory.max` (cgroup v2) or
// `memory/memory.limit_in_bytes` (v1) under `cgroup_root`; nullopt when there is none
// ("max", absent files, or a v1 "unlimited" value at or above physical memory).
std::optional<uint64_t> CgroupMemoryLimitBytes(const std::string& cgroup_root = "/sys/fs/cgroup");

// The text of a cgroup limit file -> bytes; nullopt for "max" or anything unparsable.
std::optional<uint64_t> ParseCgroupLimit(absl::string_view text);

// The smaller of the cgroup limit and physical memory.
uint64_t AvailableMemoryBytes();

}  // namespace gcomp

#endif  // GCOMP_BASE_SYSTEM_MEMORY_H_
