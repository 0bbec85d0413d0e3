#include "codec/internal/cpu.h"

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

}  // namespace

VectorLevel MaxVectorLevel() {
  static const VectorLevel level = Detect();
  return level;
}

}  // namespace gcomp::codec::internal
