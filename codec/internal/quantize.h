// The encoder's per-element pass of a block: round each element to its mantissa width,
// split it into symbol and sign + mantissa field, flag zeros, and write the plane, the
// symbols and the zero bitmap (SplitElements). QuantParams and WidthOf are the arithmetic
// the decoder's inverse pass (join_elements.h) shares. docs/FORMAT.md ("What is a zero, the
// symbols, the mantissa widths") defines it; the scalar, AVX2 and AVX-512 paths
// (quantize_scalar.cc, quantize_avx2.cc, quantize_avx512.cc; quantize.cc picks one) compute
// exactly it, so every level writes the same bytes.
//
// The widths come from a closed form instead of a per-symbol table so that the vector paths
// can evaluate 8 or 16 elements at once.
#ifndef GCOMP_CODEC_INTERNAL_QUANTIZE_H_
#define GCOMP_CODEC_INTERNAL_QUANTIZE_H_

#include <cstddef>
#include <cstdint>

#include "codec/codec.h"
#include "codec/internal/cpu.h"
#include "codec/internal/format.h"

namespace gcomp::codec::internal {

// Everything the per-element arithmetic needs, fixed for one block.
struct QuantParams {
  int mant_bits;        // W
  int top;              // sign bit position (total_bits - 1)
  uint32_t mag_mask;    // all bits below the sign
  uint32_t mant_mask;   // 2^W - 1
  uint32_t zero_test;   // lossless: every bit (only +0 is zero); otherwise mag_mask
  int zero_below;       // near-lossless: e < zero_below is zeroed; lossless: 0
  int width_offset;     // k(s) = min(width_cap, max(0, s + width_offset)) for ordinary s
  int width_cap;        // min(R, W); W in lossless mode
  int special_above;    // s > special_above (largest finite field, Inf/NaN) keeps W bits
};

QuantParams MakeQuantParams(const FloatBits& lay, const Policy& policy, int emax);

// Mantissa width of symbol s; equals MantissaWidth() in format.h for every s.
inline int WidthOf(const QuantParams& q, int s) {
  if (s == 0 || s > q.special_above) return q.mant_bits;
  int k = s + q.width_offset;
  k = k < 0 ? 0 : k;
  return k < q.width_cap ? k : q.width_cap;
}

// The encoder's whole per-element pass over in[0, n): writes the sign + mantissa plane
// (section 1) at `plane` and returns its size in bytes; writes the nonzero elements' symbols
// to syms[0, *nnz) and the nonzero bitmap (bit i of word i / 64) to bitmap[0, ceil(n / 64)).
// Room needed: plane (n * (W + 1) + 7) / 8 + 16 bytes, syms n + 8 bytes.
size_t SplitElements(DType dtype, const void* in, size_t n, const QuantParams& q,
                     uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz);
// SplitElements limited to `level` (clamped to MaxVectorLevel()); tests compare the levels.
// `pext`: whether a vector pass may join fields of up to 8 bits with PEXT (same bytes either
// way; SplitElements passes FastPext()).
size_t SplitElementsAt(VectorLevel level, DType dtype, const void* in, size_t n,
                       const QuantParams& q, uint8_t* plane, uint8_t* syms, uint64_t* bitmap,
                       size_t* nnz, bool pext);
// The same without the vector path (tests compare the two byte for byte).
size_t SplitElementsScalar(DType dtype, const void* in, size_t n, const QuantParams& q,
                           uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz);

// The largest exponent field among the finite elements of in[0, n) (0 if none).
int MaxFiniteExponent(DType dtype, const void* in, size_t n);
// MaxFiniteExponent limited to `level` (clamped to MaxVectorLevel()), and the same without
// the vector path (tests compare them).
int MaxFiniteExponentAt(VectorLevel level, DType dtype, const void* in, size_t n);
int MaxFiniteExponentScalar(DType dtype, const void* in, size_t n);

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_QUANTIZE_H_
