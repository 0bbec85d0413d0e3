// Pieces of the encoder's element pass that its scalar, AVX2 and AVX-512 versions share
// (quantize_scalar.cc, quantize_avx2.cc, quantize_avx512.cc), the vector versions' entry
// points that quantize.cc dispatches to, and WidthOf8, which join_elements_avx2.cc shares.
// Include only from those files. Functions that use vector instructions carry their own
// target attribute, never a file-wide -m flag: an inline function compiled with AVX-512
// in one file could otherwise be the copy the linker keeps for a scalar caller.
#ifndef GCOMP_CODEC_INTERNAL_QUANTIZE_KERNELS_H_
#define GCOMP_CODEC_INTERNAL_QUANTIZE_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "codec/codec.h"
#include "codec/internal/bits.h"
#include "codec/internal/quantize.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcomp::codec::internal {

// One group of count <= kGroup elements (scalar path): value[i] (sign + mantissa bits),
// bits[i] (0 for a zero, else k + 1), sym[i] (rounded exponent field).
inline constexpr size_t kGroup = 64;
struct Group {
  uint32_t value[kGroup];
  uint32_t bits[kGroup];
  uint32_t sym[kGroup];
};

template <typename U>
uint64_t QuantizeScalarTyped(const U* in, size_t count, const QuantParams& q, Group* g) {
  const int W = q.mant_bits;
  uint64_t mask = 0;
  for (size_t i = 0; i < count; ++i) {
    U raw;
    std::memcpy(&raw, in + i, sizeof(U));
    const uint32_t u = raw;
    const uint32_t mag = u & q.mag_mask;
    const int e = static_cast<int>(mag >> W);
    const uint32_t nz = (e >= q.zero_below) & ((u & q.zero_test) != 0);
    const int drop = W - WidthOf(q, e);
    const uint32_t r = (mag + ((1u << drop) >> 1)) & (~0u << drop);
    const int e2 = static_cast<int>(r >> W);
    const int k2 = WidthOf(q, e2);
    const uint32_t value = ((r & q.mant_mask) >> (W - k2)) | ((u >> q.top) << k2);
    g->value[i] = value & (0u - nz);
    g->bits[i] = static_cast<uint32_t>(k2 + 1) & (0u - nz);
    g->sym[i] = static_cast<uint32_t>(e2);
    mask |= uint64_t{nz} << i;
  }
  return mask;
}

// Appends the k + 1 bit fields of a quantized group to the plane and its nonzero symbols to
// syms[*j...]; two fields (<= 48 bits) per Put (and Flush, for a BitWriter).
template <typename Writer>
void PackGroupScalar(const Group& g, size_t count, Writer* plane, uint8_t* syms, size_t* j) {
  size_t i = 0, k = *j;
  for (; i + 2 <= count; i += 2) {
    plane->Put(g.value[i] | (uint64_t{g.value[i + 1]} << g.bits[i]), g.bits[i] + g.bits[i + 1]);
    if constexpr (std::is_same_v<Writer, BitWriter>) plane->Flush();
    syms[k] = static_cast<uint8_t>(g.sym[i]);
    k += g.bits[i] != 0;
    syms[k] = static_cast<uint8_t>(g.sym[i + 1]);
    k += g.bits[i + 1] != 0;
  }
  if (i < count) {
    plane->Put(g.value[i], g.bits[i]);
    if constexpr (std::is_same_v<Writer, BitWriter>) plane->Flush();
    syms[k] = static_cast<uint8_t>(g.sym[i]);
    k += g.bits[i] != 0;
  }
  *j = k;
}

// PackGroupScalar for the vector passes: the group's fields go byte-aligned to *bytes (which
// advances) when byte_fields, else to *w. Only copies of *w and *j reach PackGroupScalar, so
// once this is inlined the caller's loop keeps them in registers (a pointer to them that
// escaped would keep them in memory, stored and reloaded every step).
__attribute__((always_inline)) inline void PackTail(const Group& g, size_t count, bool byte_fields,
                                                    uint8_t** bytes, uint8_t* syms, WordWriter* w,
                                                    size_t* j) {
  WordWriter tail = byte_fields ? WordWriter(*bytes) : *w;
  size_t tail_j = *j;
  PackGroupScalar(g, count, &tail, syms, &tail_j);
  if (byte_fields) *bytes += tail.Finish();
  *w = tail;
  *j = tail_j;
}

// Non-negative magnitudes order like their bit patterns; non-finite ones count as 0.
template <typename U>
uint32_t MaxFiniteMagScalar(const U* in, size_t n, uint32_t mag_mask, uint32_t inf) {
  uint32_t best = 0;
  for (size_t i = 0; i < n; ++i) {
    U raw;
    std::memcpy(&raw, in + i, sizeof(U));
    uint32_t mag = raw & mag_mask;
    mag = mag < inf ? mag : 0;
    best = mag > best ? mag : best;
  }
  return best;
}

// Which form of the pass a block takes: lossless (every nonzero keeps W bits, only +0 is a
// zero), near-lossless with no nonzero element of exponent field 0 (zero_below >= 1), or
// near-lossless keeping field 0 (zero_below == 0: subnormals keep W bits; f16 blocks whose
// largest magnitude is under 4 at the default A).
enum class SplitPath { kLossless, kNearLossless, kGeneral };
inline SplitPath SplitPathOf(const QuantParams& q) {
  if (q.zero_test == ~uint32_t{0}) return SplitPath::kLossless;
  if (q.zero_below >= 1) return SplitPath::kNearLossless;
  return SplitPath::kGeneral;
}

#if defined(__x86_64__)

// Appends two groups of 8 fields, each the bits of a byte in `bytes` that its byte in `masks`
// selects (one PEXT per group; see the PEXT joins in quantize_avx2.cc and quantize_avx512.cc).
__attribute__((target("avx2,bmi2,popcnt"), always_inline)) inline void PutPext16(__m128i bytes,
                                                                                 __m128i masks,
                                                                                 WordWriter& w) {
  const uint64_t mask_a = static_cast<uint64_t>(_mm_cvtsi128_si64(masks));
  const uint64_t mask_b = static_cast<uint64_t>(_mm_extract_epi64(masks, 1));
  w.Put(_pext_u64(static_cast<uint64_t>(_mm_cvtsi128_si64(bytes)), mask_a),
        static_cast<unsigned>(__builtin_popcountll(mask_a)));
  w.Put(_pext_u64(static_cast<uint64_t>(_mm_extract_epi64(bytes, 1)), mask_b),
        static_cast<unsigned>(__builtin_popcountll(mask_b)));
}

// k(s) for 8 symbols at once; see WidthOf.
__attribute__((target("avx2"))) inline __m256i WidthOf8(__m256i s, __m256i offset, __m256i cap,
                                                        __m256i full, __m256i special_above) {
  __m256i k = _mm256_add_epi32(s, offset);
  k = _mm256_max_epi32(k, _mm256_setzero_si256());
  k = _mm256_min_epi32(k, cap);
  const __m256i special = _mm256_or_si256(_mm256_cmpeq_epi32(s, _mm256_setzero_si256()),
                                          _mm256_cmpgt_epi32(s, special_above));
  return _mm256_blendv_epi8(k, full, special);
}

// The vector versions of the public passes in quantize.h. Call them only at a level
// MaxVectorLevel() allows.
// `pext`: join near-lossless fields of up to 8 bits with PEXT (see FastPext in cpu.h).
size_t SplitElementsAvx2(DType dtype, const void* in, size_t n, const QuantParams& q,
                         uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz, bool pext);
// `pext` as for SplitElementsAvx2.
size_t SplitElementsAvx512(DType dtype, const void* in, size_t n, const QuantParams& q,
                           uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz, bool pext);
int MaxFiniteExponentAvx2(DType dtype, const void* in, size_t n);

#endif  // __x86_64__

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_QUANTIZE_KERNELS_H_
