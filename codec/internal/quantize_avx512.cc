// The encoder's element pass with AVX-512 (F, BW, VL, VBMI, VBMI2), 16 elements a step,
// for lossless and near-lossless blocks (groups holding Inf, NaN, the top binade or, where
// the block keeps exponent field 0, a subnormal take QuantizeGeneral16): mask registers replace the
// zero lanes' blends, vpcompressb packs the symbols, and with fields of <= 8 bits (R <= 7) eight of
// them go to the plane in one 64-bit put, joined by PEXT where it is fast (cpu.h FastPext). Each
// function carries its target attribute, so this file builds for any x86-64 CPU and its code
// runs only where cpu.cc found AVX-512.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/internal/bits.h"
#include "codec/internal/cpu.h"
#include "codec/internal/quantize.h"
#include "codec/internal/quantize_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

// GCC 12's AVX-512 headers trip its own uninitialized-value warnings (the intrinsics'
// "undefined" placeholder operands); they are not ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace gcomp::codec::internal {
namespace {

template <typename U>
__attribute__((target(GCOMP_TARGET_AVX512))) inline __m512i Load16(const U* p) {
  if constexpr (sizeof(U) == 4) {
    return _mm512_loadu_si512(p);
  } else {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// Appends 16 fields (value, width) to the plane: in eights (<= 64 bits) when every field
// has <= 8 bits, in fours (<= 56) when <= 14 (always for 16-bit U), else in pairs (<= 48).
// always_inline: in this file GCC keeps it out of line (max-inline-insns-single), and the call
// slows near-lossless encoding by some 8%.
template <typename U>
__attribute__((always_inline, target(GCOMP_TARGET_AVX512))) inline void PutFields16(__m512i value,
                                                                                    __m512i bits,
                                                                                    WordWriter& w) {
  const __m512i lo32 = _mm512_set1_epi64(0xffffffff);
  const __m512i first = _mm512_and_si512(bits, lo32);
  const __m512i pv = _mm512_or_si512(_mm512_and_si512(value, lo32),
                                     _mm512_sllv_epi64(_mm512_srli_epi64(value, 32), first));
  const __m512i pb = _mm512_add_epi64(first, _mm512_srli_epi64(bits, 32));
  alignas(64) uint64_t tv[8], tb[8];
  // 16-bit floats' fields have at most 11 bits: always fours, with no branch to mispredict
  // where f16 subnormals (11 bits) and narrower fields mix.
  const __mmask16 over8 =
      sizeof(U) == 2 ? 0xffff : _mm512_cmpgt_epi32_mask(bits, _mm512_set1_epi32(8));
  if (sizeof(U) == 2 || __builtin_expect(over8 == 0, 1) ||
      _mm512_cmpgt_epi32_mask(bits, _mm512_set1_epi32(14)) == 0) {
    const __m512i qv = _mm512_or_si512(pv, _mm512_sllv_epi64(_mm512_bsrli_epi128(pv, 8), pb));
    const __m512i qb = _mm512_add_epi64(pb, _mm512_bsrli_epi128(pb, 8));
    if (sizeof(U) == 4 && __builtin_expect(over8 == 0, 1)) {
      // Fours in 64-bit lanes 0, 2, 4, 6 (<= 32 bits each): join 0 with 2 and 4 with 6.
      const __m512i up = _mm512_set_epi64(0, 0, 0, 6, 0, 0, 0, 2);
      const __m512i ov =
          _mm512_or_si512(qv, _mm512_sllv_epi64(_mm512_permutexvar_epi64(up, qv), qb));
      const __m512i ob = _mm512_add_epi64(qb, _mm512_permutexvar_epi64(up, qb));
      _mm512_store_si512(tv, ov);
      _mm512_store_si512(tb, ob);
      w.Put(tv[0], static_cast<unsigned>(tb[0]));
      w.Put(tv[4], static_cast<unsigned>(tb[4]));
      return;
    }
    _mm512_store_si512(tv, qv);
    _mm512_store_si512(tb, qb);
    for (int k = 0; k < 8; k += 2) w.Put(tv[k], static_cast<unsigned>(tb[k]));
    return;
  }
  _mm512_store_si512(tv, pv);
  _mm512_store_si512(tb, pb);
  for (int k = 0; k < 8; ++k) w.Put(tv[k], static_cast<unsigned>(tb[k]));
}

// Appends 16 fields of <= 8 bits to the plane with PEXT, as PutOrdinaryBytes8 in
// quantize_avx2.cc: byte 2 of each lane holds B (the sign above the 7 top mantissa bits),
// byte 3 the mask of B's top k2 + 1 bits (0 for a zero).
__attribute__((always_inline, target(GCOMP_TARGET_AVX512))) inline void PutMaskedBytes16(
    __m512i both, WordWriter& w) {
  alignas(64) static constexpr uint8_t kBytes23[64] = {2,  6,  10, 14, 18, 22, 26, 30, 34, 38, 42,
                                                       46, 50, 54, 58, 62, 3,  7,  11, 15, 19, 23,
                                                       27, 31, 35, 39, 43, 47, 51, 55, 59, 63};
  const __m512i packed = _mm512_permutexvar_epi8(_mm512_load_si512(kBytes23), both);
  PutPext16(_mm512_castsi512_si128(packed), _mm512_extracti32x4_epi32(packed, 1), w);
}

// The quantization of 16 elements of any kind by the closed form with both special cases
// (QuantizeGeneral8 in quantize_avx2.cc). Kept out of line: the groups that need it are
// rare, and its constants would crowd the registers of the common loop.
struct General16 {
  __m512i value, bits, sym;
  __mmask16 nz;
};
__attribute__((noinline, target(GCOMP_TARGET_AVX512))) General16 QuantizeGeneral16(
    __m512i u, const QuantParams& q) {
  const __m512i zero = _mm512_setzero_si512();
  const __m512i full = _mm512_set1_epi32(q.mant_bits);
  const __m512i offset = _mm512_set1_epi32(q.width_offset);
  const __m512i cap = _mm512_set1_epi32(q.width_cap);
  const __m512i special_above = _mm512_set1_epi32(q.special_above);
  const __m512i one = _mm512_set1_epi32(1);
  const __m128i W = _mm_cvtsi32_si128(q.mant_bits);
  // k(s) of WidthOf: W bits for s = 0 and s > special_above.
  const auto width_of = [&](__m512i s) __attribute__((target(GCOMP_TARGET_AVX512))) {
    const __m512i k = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(s, offset), zero), cap);
    const __mmask16 special =
        _mm512_cmpeq_epi32_mask(s, zero) | _mm512_cmpgt_epi32_mask(s, special_above);
    return _mm512_mask_mov_epi32(k, special, full);
  };
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(static_cast<int>(q.mag_mask)));
  const __m512i e = _mm512_srl_epi32(mag, W);
  General16 r;
  // nz = e >= zero_below && (u & zero_test) != 0
  r.nz = _mm512_mask_cmpgt_epi32_mask(
      _mm512_test_epi32_mask(u, _mm512_set1_epi32(static_cast<int>(q.zero_test))), e,
      _mm512_set1_epi32(q.zero_below - 1));
  const __m512i drop = _mm512_sub_epi32(full, width_of(e));
  const __m512i rounded =
      _mm512_and_si512(_mm512_add_epi32(mag, _mm512_srli_epi32(_mm512_sllv_epi32(one, drop), 1)),
                       _mm512_sllv_epi32(_mm512_set1_epi32(-1), drop));
  r.sym = _mm512_srl_epi32(rounded, W);
  const __m512i k2 = width_of(r.sym);
  const __m512i mant =
      _mm512_srlv_epi32(_mm512_and_si512(rounded, _mm512_set1_epi32(static_cast<int>(q.mant_mask))),
                        _mm512_sub_epi32(full, k2));
  const __m512i sign = _mm512_sllv_epi32(_mm512_srl_epi32(u, _mm_cvtsi32_si128(q.top)), k2);
  r.value = _mm512_maskz_or_epi32(r.nz, mant, sign);
  r.bits = _mm512_maskz_add_epi32(r.nz, k2, one);
  return r;
}

template <typename U, SplitPath P, bool kPext = false>
__attribute__((target(GCOMP_TARGET_AVX512))) size_t Split512Typed(const U* in, size_t n,
                                                                  const QuantParams& q,
                                                                  uint8_t* plane, uint8_t* syms,
                                                                  uint64_t* bitmap, size_t* nnz) {
  // kGeneral: near-lossless keeping exponent field 0. As in the AVX2 pass, 16 elements
  // holding no subnormal take the ordinary form with zero_below 1 (their field-0 elements
  // are zeros either way), the others QuantizeGeneral16 with the block's parameters.
  constexpr bool kSubnormals = P == SplitPath::kGeneral;
  constexpr bool kTriples = P == SplitPath::kLossless && sizeof(U) == 4;  // 24-bit fields
  const bool bytes8 = P == SplitPath::kLossless && q.mant_bits == 7;      // 8-bit fields
  const __m512i mag_mask = _mm512_set1_epi32(static_cast<int>(q.mag_mask));
  const __m512i mant_mask = _mm512_set1_epi32(static_cast<int>(q.mant_mask));
  const __m512i zero_floor = _mm512_set1_epi32(kSubnormals ? 0 : q.zero_below - 1);
  const __m512i ordinary_limit = _mm512_set1_epi32(q.special_above - 1);
  const __m512i offset = _mm512_set1_epi32(q.width_offset);
  const __m512i cap = _mm512_set1_epi32(q.width_cap);
  const __m512i full = _mm512_set1_epi32(q.mant_bits);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i half_w = _mm512_set1_epi32(1 << (q.mant_bits - 1));
  const __m128i W = _mm_cvtsi32_si128(q.mant_bits);
  const __m128i top = _mm_cvtsi32_si128(q.top);
  const __m128i to_bit23 = _mm_cvtsi32_si128(23 - q.mant_bits);
  const __m512i sign32 = _mm512_set1_epi32(INT32_MIN);
  // Bytes 0-2 of each 32-bit lane, side by side.
  alignas(64) uint8_t triple_index[64] = {};
  for (int k = 0; k < 48; ++k) triple_index[k] = static_cast<uint8_t>(4 * (k / 3) + k % 3);
  const __m512i triples = _mm512_load_si512(triple_index);

  uint8_t* const bitmap_bytes = reinterpret_cast<uint8_t*>(bitmap);
  if (n > 0) bitmap[(n - 1) / 64] = 0;  // the tail below writes only its own bytes
  uint8_t* bytes = plane;               // where byte-aligned fields go next
  WordWriter w(plane);
  Group g;
  size_t j = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = Load16(in + i);
    const __m512i mag = _mm512_and_si512(u, mag_mask);
    const __m512i e = _mm512_srl_epi32(mag, W);
    __m512i value, bits, sym;
    __mmask16 nz;
    if constexpr (P == SplitPath::kLossless) {
      nz = _mm512_test_epi32_mask(u, u);
      sym = e;
      value = _mm512_or_si512(_mm512_and_si512(u, mant_mask),
                              _mm512_sll_epi32(_mm512_srl_epi32(u, top), W));
      bits = _mm512_maskz_add_epi32(nz, full, one);
    } else {
      __mmask16 general = _mm512_cmpgt_epi32_mask(e, ordinary_limit);
      if constexpr (kSubnormals) {
        general |= _mm512_mask_test_epi32_mask(_mm512_cmpeq_epi32_mask(e, zero), mag, mag);
      }
      if (__builtin_expect(general != 0, 0)) {
        // Inf/NaN, the top binade or a subnormal among these 16: fields of up to W + 1 bits.
        const General16 r = QuantizeGeneral16(u, q);
        value = r.value, bits = r.bits, sym = r.sym, nz = r.nz;
      } else {
        // As QuantizeOrdinary8: zero_below >= 1, so e >= zero_below implies a nonzero.
        nz = _mm512_cmpgt_epi32_mask(e, zero_floor);
        const __m512i k =
            _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(e, offset), zero), cap);
        const __m512i drop = _mm512_sub_epi32(full, k);
        const __m512i rounded = _mm512_add_epi32(mag, _mm512_srlv_epi32(half_w, k));
        sym = _mm512_srl_epi32(rounded, W);
        const __m512i k2 =
            _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(sym, offset), zero), cap);
        if constexpr (kPext) {
          // The sign at bit W, above the mantissa; then (16-bit floats) up to bit 23.
          __m512i y = _mm512_or_si512(_mm512_and_si512(rounded, mant_mask),
                                      _mm512_sll_epi32(_mm512_srl_epi32(u, top), W));
          if constexpr (sizeof(U) == 2) y = _mm512_sll_epi32(y, to_bit23);
          PutMaskedBytes16(_mm512_or_si512(y, _mm512_maskz_srav_epi32(nz, sign32, k2)), w);
          const uint16_t m16 = static_cast<uint16_t>(nz);
          std::memcpy(bitmap_bytes + i / 8, &m16, 2);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(syms + j),
                           _mm_maskz_compress_epi8(nz, _mm512_cvtepi32_epi8(sym)));
          j += static_cast<size_t>(__builtin_popcount(m16));
          continue;
        }
        const __m512i mant = _mm512_srlv_epi32(_mm512_and_si512(rounded, mant_mask), drop);
        const __m512i sign = _mm512_sllv_epi32(_mm512_srl_epi32(u, top), k2);
        value = _mm512_maskz_or_epi32(nz, mant, sign);
        bits = _mm512_maskz_add_epi32(nz, k2, one);
      }
    }
    const uint16_t m16 = static_cast<uint16_t>(nz);
    std::memcpy(bitmap_bytes + i / 8, &m16, 2);
    const int count = __builtin_popcount(m16);
    if constexpr (kTriples) {
      const __m512i packed =
          _mm512_permutexvar_epi8(triples, _mm512_maskz_compress_epi32(nz, value));
      _mm512_mask_storeu_epi8(bytes, (uint64_t{1} << (3 * count)) - 1, packed);
      bytes += 3 * count;
    } else if (bytes8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bytes),
                       _mm_maskz_compress_epi8(nz, _mm512_cvtepi32_epi8(value)));
      bytes += count;
    } else {
      PutFields16<U>(value, bits, w);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(syms + j),
                     _mm_maskz_compress_epi8(nz, _mm512_cvtepi32_epi8(sym)));
    j += static_cast<size_t>(count);
  }
  if (i < n) {  // the last < 16 elements
    const uint64_t m = QuantizeScalarTyped(in + i, n - i, q, &g);
    const uint16_t m16 = static_cast<uint16_t>(m);
    std::memcpy(bitmap_bytes + i / 8, &m16, (n - i + 7) / 8);
    PackTail(g, n - i, kTriples || bytes8, &bytes, syms, &w, &j);
  }
  *nnz = j;
  if (kTriples || bytes8) return static_cast<size_t>(bytes - plane);
  return w.Finish();
}

template <typename U>
size_t Split512(const U* in, size_t n, const QuantParams& q, uint8_t* plane, uint8_t* syms,
                uint64_t* bitmap, size_t* nnz, bool pext) {
  if (SplitPathOf(q) == SplitPath::kLossless) {
    return Split512Typed<U, SplitPath::kLossless>(in, n, q, plane, syms, bitmap, nnz);
  }
  const bool join_pext = pext && q.width_cap <= 7;
  if (SplitPathOf(q) == SplitPath::kGeneral) {
    return join_pext
               ? Split512Typed<U, SplitPath::kGeneral, true>(in, n, q, plane, syms, bitmap, nnz)
               : Split512Typed<U, SplitPath::kGeneral>(in, n, q, plane, syms, bitmap, nnz);
  }
  return join_pext
             ? Split512Typed<U, SplitPath::kNearLossless, true>(in, n, q, plane, syms, bitmap, nnz)
             : Split512Typed<U, SplitPath::kNearLossless>(in, n, q, plane, syms, bitmap, nnz);
}

}  // namespace

size_t SplitElementsAvx512(DType dtype, const void* in, size_t n, const QuantParams& q,
                           uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz,
                           bool pext) {
  if (dtype == DType::kF32) {
    return Split512(static_cast<const uint32_t*>(in), n, q, plane, syms, bitmap, nnz, pext);
  }
  return Split512(static_cast<const uint16_t*>(in), n, q, plane, syms, bitmap, nnz, pext);
}

}  // namespace gcomp::codec::internal

#pragma GCC diagnostic pop

#endif  // __x86_64__
