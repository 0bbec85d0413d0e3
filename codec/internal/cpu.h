// Which vector instruction sets the codec's hot loops may use on this CPU. Internal to
// codec/; every vectorized path has a scalar twin that tests compare it with.
#ifndef GCOMP_CODEC_INTERNAL_CPU_H_
#define GCOMP_CODEC_INTERNAL_CPU_H_

namespace gcomp::codec::internal {

// In increasing order. AVX-512 here means F, BW, VL, VBMI and VBMI2 (Ice Lake, Zen 4 and
// later).
enum class VectorLevel { kScalar, kAvx2, kAvx512 };

// The target attribute of functions that use the kAvx512 instructions.
#define GCOMP_TARGET_AVX512 "avx512f,avx512bw,avx512vl,avx512vbmi,avx512vbmi2,avx2,bmi2,popcnt"

// The best level this CPU has; kScalar off x86-64. Detected once; the environment variable
// GCOMP_SIMD=avx2 or GCOMP_SIMD=scalar caps it (the bytes written never depend on it).
VectorLevel MaxVectorLevel();

// Whether BMI2's PEXT takes a few cycles on this CPU: on every Intel CPU that has BMI2 and on
// AMD from Zen 3 (family 19h) on. Zen 1 and Zen 2 run it as microcode (tens to hundreds of
// cycles), slower than the shifts it replaces, so the AVX2 pass uses it only where this is
// true. Detected once; GCOMP_PEXT=off in the environment makes it false and GCOMP_PEXT=on
// true (to compare or fuzz the paths on any CPU with BMI2); other values are ignored.
bool FastPext();

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_CPU_H_
