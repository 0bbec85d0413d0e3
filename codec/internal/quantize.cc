// The encoder's element pass: the per-block parameters, and the choice among its scalar,
// AVX2 and AVX-512 versions (quantize_scalar.cc, quantize_avx2.cc, quantize_avx512.cc).
#include "codec/internal/quantize.h"

#include "codec/internal/cpu.h"
#include "codec/internal/quantize_kernels.h"

namespace gcomp::codec::internal {

QuantParams MakeQuantParams(const FloatBits& lay, const Policy& policy, int emax) {
  QuantParams q;
  q.mant_bits = lay.mant_bits;
  q.top = lay.total_bits - 1;
  q.mag_mask = static_cast<uint32_t>((uint64_t{1} << q.top) - 1);
  q.mant_mask = (uint32_t{1} << lay.mant_bits) - 1;
  q.special_above = lay.all_ones() - 2;
  if (policy.mode == Mode::kLossless) {
    q.zero_test = ~uint32_t{0};
    q.zero_below = 0;
    q.width_offset = 1 << 20;  // every ordinary symbol saturates at width_cap = W
    q.width_cap = lay.mant_bits;
  } else {
    q.zero_test = q.mag_mask;
    q.zero_below = emax + policy.abs_log2 > 0 ? emax + policy.abs_log2 : 0;
    q.width_offset = -policy.abs_log2 - 1 - emax;
    q.width_cap = policy.rel_bits < lay.mant_bits ? policy.rel_bits : lay.mant_bits;
  }
  return q;
}

int MaxFiniteExponentAt(VectorLevel level, DType dtype, const void* in, size_t n) {
#if defined(__x86_64__)
  if (level > MaxVectorLevel()) level = MaxVectorLevel();
  if (level >= VectorLevel::kAvx2) return MaxFiniteExponentAvx2(dtype, in, n);  // AVX-512 too
#endif
  return MaxFiniteExponentScalar(dtype, in, n);
}

int MaxFiniteExponent(DType dtype, const void* in, size_t n) {
  return MaxFiniteExponentAt(MaxVectorLevel(), dtype, in, n);
}

size_t SplitElementsAt(VectorLevel level, DType dtype, const void* in, size_t n,
                       const QuantParams& q, uint8_t* plane, uint8_t* syms, uint64_t* bitmap,
                       size_t* nnz, bool pext) {
#if defined(__x86_64__)
  if (level > MaxVectorLevel()) level = MaxVectorLevel();
  if (level == VectorLevel::kAvx512) {
    return SplitElementsAvx512(dtype, in, n, q, plane, syms, bitmap, nnz, pext);
  }
  if (level >= VectorLevel::kAvx2) {
    return SplitElementsAvx2(dtype, in, n, q, plane, syms, bitmap, nnz, pext);
  }
#endif
  return SplitElementsScalar(dtype, in, n, q, plane, syms, bitmap, nnz);
}

size_t SplitElements(DType dtype, const void* in, size_t n, const QuantParams& q, uint8_t* plane,
                     uint8_t* syms, uint64_t* bitmap, size_t* nnz) {
  return SplitElementsAt(MaxVectorLevel(), dtype, in, n, q, plane, syms, bitmap, nnz, FastPext());
}

}  // namespace gcomp::codec::internal
