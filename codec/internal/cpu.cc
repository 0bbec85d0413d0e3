// Detects the vector level once per process (cpu.h); GCOMP_SIMD caps it.
#include "codec/internal/cpu.h"

#include <cstdlib>
#include <cstring>

namespace gcomp::codec::internal {
namespace {

VectorLevel Detect() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi") &&
      __builtin_cpu_supports("avx512vbmi2")) {
    return VectorLevel::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("bmi2")) {
    return VectorLevel::kAvx2;
  }
#endif
  return VectorLevel::kScalar;
}

// GCOMP_SIMD=scalar|avx2 lowers the level (to compare paths, or to rule one out); unknown
// values are ignored.
VectorLevel Capped(VectorLevel level) {
  const char* cap = std::getenv("GCOMP_SIMD");
  if (cap == nullptr) return level;
  if (std::strcmp(cap, "scalar") == 0) return VectorLevel::kScalar;
  if (std::strcmp(cap, "avx2") == 0 && level > VectorLevel::kAvx2) return VectorLevel::kAvx2;
  return level;
}

}  // namespace

VectorLevel MaxVectorLevel() {
  static const VectorLevel level = Capped(Detect());
  return level;
}

}  // namespace gcomp::codec::internal
