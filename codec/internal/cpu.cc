// Detects the vector level once per process (cpu.h); GCOMP_SIMD caps it.
#include "codec/internal/cpu.h"

#include <cstdlib>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

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

bool HasBmi2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("bmi2");
#else
  return false;
#endif
}

bool DetectFastPext() {
#if defined(__x86_64__)
  if (!HasBmi2()) return false;
  unsigned eax, ebx, ecx, edx;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  char vendor[13];
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  vendor[12] = '\0';
  if (std::strcmp(vendor, "GenuineIntel") == 0) return true;
  if (std::strcmp(vendor, "AuthenticAMD") != 0) return false;  // Hygon is Zen 1
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  unsigned family = (eax >> 8) & 0xf;
  if (family == 0xf) family += (eax >> 20) & 0xff;
  return family >= 0x19;
#else
  return false;
#endif
}

}  // namespace

bool FastPext() {
  static const bool fast = [] {
    const char* pext = std::getenv("GCOMP_PEXT");
    if (pext != nullptr && std::strcmp(pext, "off") == 0) return false;
    if (pext != nullptr && std::strcmp(pext, "on") == 0) return HasBmi2();
    return DetectFastPext();
  }();
  return fast;
}

VectorLevel MaxVectorLevel() {
  static const VectorLevel level = Capped(Detect());
  return level;
}

}  // namespace gcomp::codec::internal
