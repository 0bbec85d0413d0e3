// The decoder's element pass with AVX2 (and BMI2, POPCNT): 8 nonzero elements a step into
// a chunk buffer (fields of up to 8 bits read by PDEP where cpu.h's FastPext() holds), then
// spread out by the zero bitmap. Each function carries its target
// attribute, so this file builds for any x86-64 CPU and its code runs only where cpu.cc
// found AVX2 (the AVX-512 level uses this pass too).
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/internal/join_elements.h"
#include "codec/internal/join_elements_kernels.h"
#include "codec/internal/quantize_kernels.h"
#include "format/endian.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace gcomp::codec::internal {
namespace {

// Decoder tables: kExpand.rank32[m] gives, for each of 8 output lanes whose bit is set in m,
// the index of its value among the packed nonzeros; kExpand.shuffle16[m] does the same for
// 16-bit lanes as pshufb indices (0x80 = zero).
struct ExpandTables {
  uint64_t rank32[256];
  uint8_t shuffle16[256][16];
  constexpr ExpandTables() : rank32(), shuffle16() {
    for (int m = 0; m < 256; ++m) {
      int k = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (m & (1 << lane)) {
          rank32[m] |= uint64_t(k) << (8 * lane);
          shuffle16[m][2 * lane] = static_cast<uint8_t>(2 * k);
          shuffle16[m][2 * lane + 1] = static_cast<uint8_t>(2 * k + 1);
          ++k;
        } else {
          shuffle16[m][2 * lane] = shuffle16[m][2 * lane + 1] = 0x80;
        }
      }
    }
  }
};
constexpr ExpandTables kExpand;

struct JoinVectors {
  __m256i offset, cap, full, special_above, one, narrow, seven, sign32, low7, bit7;
  __m128i W, top, mant_from7, sign_from7;
};

// How the fields of 8 elements are read: 3 whole bytes each (lossless f32), 1 byte each
// (lossless bf16), any widths, or any widths with PDEP for 8 fields of <= 8 bits.
enum class FieldPath { kTriples, kBytes, kBits, kBitsPdep };

// 8 nonzero elements from their symbols and the plane at bit *pos, which advances. Needs
// (*pos >> 3) + 32 <= plane size (the widest 8 fields, 192 bits, plus an 8-byte load).
template <FieldPath P>
__attribute__((always_inline, target("avx2,bmi2,popcnt"))) inline __m256i Join8(
    const uint8_t* syms, const uint8_t* plane, uint64_t* pos, const JoinVectors& v) {
  const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(syms)));
  const __m256i k = WidthOf8(s, v.offset, v.cap, v.full, v.special_above);
  const __m256i w = _mm256_add_epi32(k, v.one);
  __m256i f;
  if constexpr (P == FieldPath::kTriples) {
    const __m128i expand = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    const uint8_t* p = plane + (*pos >> 3);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12));
    f = _mm256_set_m128i(_mm_shuffle_epi8(b, expand), _mm_shuffle_epi8(a, expand));
    *pos += 8 * 24;
  } else if constexpr (P == FieldPath::kBytes) {
    f = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(plane + (*pos >> 3))));
    *pos += 8 * 8;
  } else {
    if constexpr (P == FieldPath::kBitsPdep) {
      if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpgt_epi32(k, v.seven)) == 0, 1)) {
        // The inverse of the encoder's PEXT join (quantize_avx2.cc): PDEP puts each field in
        // the top k + 1 bits of its own byte, giving B = (sign, top mantissa bits, zeros).
        const __m256i keep = _mm256_shuffle_epi8(
            _mm256_srav_epi32(v.sign32, k),
            _mm256_setr_epi8(3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 3, 7, 11,
                             15, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
        const uint64_t mask = static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_castsi256_si128(
            _mm256_permutevar8x32_epi32(keep, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0)))));
        // Up to 64 bits from bit *pos: two loads joined (the loop leaves 32 readable bytes).
        const uint64_t at = *pos;
        const uint8_t* p = plane + (at >> 3);
        const unsigned __int128 pair =
            (static_cast<unsigned __int128>(format::LoadLE64(p + 8)) << 64) | format::LoadLE64(p);
        const uint64_t bits = static_cast<uint64_t>(pair >> (at & 7));
        *pos += static_cast<uint64_t>(__builtin_popcountll(mask));
        const __m256i b =
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(_pdep_u64(bits, mask))));
        const __m256i mant = _mm256_sll_epi32(_mm256_and_si256(b, v.low7), v.mant_from7);
        const __m256i sign = _mm256_sll_epi32(_mm256_and_si256(b, v.bit7), v.sign_from7);
        return _mm256_or_si256(_mm256_or_si256(mant, sign), _mm256_sll_epi32(s, v.W));
      }
    }
    // Bit offsets of the fields: an exclusive prefix sum of the widths.
    __m256i incl = _mm256_add_epi32(w, _mm256_slli_si256(w, 4));
    incl = _mm256_add_epi32(incl, _mm256_slli_si256(incl, 8));
    incl = _mm256_add_epi32(
        incl, _mm256_and_si256(
                  _mm256_permutevar8x32_epi32(incl, _mm256_setr_epi32(0, 0, 0, 0, 3, 3, 3, 3)),
                  _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1)));
    const __m256i excl = _mm256_sub_epi32(incl, w);
    alignas(32) uint32_t at[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(at), incl);
    const uint64_t pa = *pos, pb = pa + at[3];
    if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpgt_epi32(w, v.narrow)) == 0, 1)) {
      // Fields of <= 14 bits: 4 of them (<= 56 bits) from each of two 8-byte loads.
      const uint64_t xa = format::LoadLE64(plane + (pa >> 3)) >> (pa & 7);
      const uint64_t xb = format::LoadLE64(plane + (pb >> 3)) >> (pb & 7);
      const __m256i ea = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(excl));
      const __m256i eb = _mm256_cvtepu32_epi64(_mm_sub_epi32(
          _mm256_extracti128_si256(excl, 1), _mm_set1_epi32(static_cast<int>(at[3]))));
      const __m256i fa = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(xa)), ea);
      const __m256i fb = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(xb)), eb);
      f = _mm256_blend_epi32(
          _mm256_permutevar8x32_epi32(fa, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)),
          _mm256_permutevar8x32_epi32(fb, _mm256_setr_epi32(0, 0, 0, 0, 0, 2, 4, 6)), 0xf0);
    } else {
      alignas(32) uint32_t off[8], field[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(off), excl);
      for (int t = 0; t < 8; ++t) {
        const uint64_t p = pa + off[t];
        field[t] = static_cast<uint32_t>(format::LoadLE64(plane + (p >> 3)) >> (p & 7));
      }
      f = _mm256_load_si256(reinterpret_cast<const __m256i*>(field));
    }
    *pos += at[7];  // bits above a field's width are masked off below
  }
  const __m256i mant = _mm256_and_si256(f, _mm256_sub_epi32(_mm256_sllv_epi32(v.one, k), v.one));
  const __m256i sign = _mm256_and_si256(_mm256_srlv_epi32(f, k), v.one);
  return _mm256_or_si256(_mm256_or_si256(_mm256_sll_epi32(sign, v.top), _mm256_sll_epi32(s, v.W)),
                         _mm256_sllv_epi32(mant, _mm256_sub_epi32(v.full, k)));
}

template <typename U>
__attribute__((target("avx2"))) inline void Store8(uint8_t* out, __m256i x) {
  if constexpr (sizeof(U) == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x);
  } else {  // 8 x u32 (each < 2^16) -> 8 x u16, in order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
  }
}

// Elements are rebuilt in chunks: the nonzeros of a chunk into a small buffer, then spread
// out by the bitmap (or written in place when the chunk has no zeros).
constexpr size_t kJoinChunk = 2048;

// Decodes the next m nonzeros (from syms[*j], the plane at bit *pos) to dst (room for m + 8).
template <typename U, FieldPath P>
__attribute__((target("avx2,bmi2,popcnt"))) void DecodeRun(const uint8_t* syms,
                                                           const uint8_t* plane, size_t size,
                                                           const QuantParams& q,
                                                           const JoinVectors& v, uint64_t* pos,
                                                           size_t* j, uint8_t* dst, size_t m) {
  uint64_t at = *pos;  // locals: no store and reload between iterations
  const uint8_t* s = syms + *j;
  size_t i = 0;
  for (; i + 8 <= m && (at >> 3) + 32 <= size; i += 8) {
    Store8<U>(dst + i * sizeof(U), Join8<P>(s + i, plane, &at, v));
  }
  size_t next = *j + i;
  for (; i < m; ++i) PutElem<U>(dst, i, NextElement<U>(syms, &next, plane, size, &at, q));
  *j += m;
  *pos = at;
}

template <typename U, FieldPath P>
__attribute__((target("avx2,bmi2,popcnt"))) absl::Status JoinAvx2Typed(
    const uint8_t* syms, size_t nnz, const uint8_t* plane, size_t size, const QuantParams& q,
    const uint64_t* bitmap, size_t n, uint8_t* out) {
  JoinVectors v;
  v.offset = _mm256_set1_epi32(q.width_offset);
  v.cap = _mm256_set1_epi32(q.width_cap);
  v.full = _mm256_set1_epi32(q.mant_bits);
  v.special_above = _mm256_set1_epi32(q.special_above);
  v.one = _mm256_set1_epi32(1);
  v.narrow = _mm256_set1_epi32(14);
  v.seven = _mm256_set1_epi32(7);
  v.sign32 = _mm256_set1_epi32(INT32_MIN);
  v.low7 = _mm256_set1_epi32(0x7f);
  v.bit7 = _mm256_set1_epi32(0x80);
  v.W = _mm_cvtsi32_si128(q.mant_bits);
  v.top = _mm_cvtsi32_si128(q.top);
  v.mant_from7 = _mm_cvtsi32_si128(q.mant_bits - 7);
  v.sign_from7 = _mm_cvtsi32_si128(q.top - 7);
  uint64_t pos = 0;
  size_t j = 0;
  alignas(32) U buf[kJoinChunk + 8];
  uint8_t* const packed = reinterpret_cast<uint8_t*>(buf);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (size_t lo = 0; lo < n; lo += kJoinChunk) {
    const size_t cnt = n - lo < kJoinChunk ? n - lo : kJoinChunk;
    uint8_t* dst = out + lo * sizeof(U);
    if (bitmap == nullptr) {
      DecodeRun<U, P>(syms, plane, size, q, v, &pos, &j, dst, cnt);
      continue;
    }
    const uint64_t* words = bitmap + lo / 64;
    size_t m = 0;
    for (size_t w = 0; w * 64 < cnt; ++w) m += static_cast<size_t>(__builtin_popcountll(words[w]));
    if (m == cnt) {
      DecodeRun<U, P>(syms, plane, size, q, v, &pos, &j, dst, cnt);
      continue;
    }
    DecodeRun<U, P>(syms, plane, size, q, v, &pos, &j, packed, m);
    size_t k = 0, g = 0;
    for (; g + 8 <= cnt; g += 8) {
      const uint32_t m8 = static_cast<uint32_t>(words[g / 64] >> (g % 64)) & 0xff;
      if constexpr (sizeof(U) == 4) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buf + k));
        const __m256i rank =
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kExpand.rank32[m8])));
        const __m256i keep = _mm256_cmpeq_epi32(
            _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(m8)), lane_bit), lane_bit);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + g * 4),
                            _mm256_and_si256(_mm256_permutevar8x32_epi32(x, rank), keep));
      } else {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + k));
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(dst + g * 2),
            _mm_shuffle_epi8(
                x, _mm_load_si128(reinterpret_cast<const __m128i*>(kExpand.shuffle16[m8]))));
      }
      k += static_cast<size_t>(__builtin_popcount(m8));
    }
    for (; g < cnt; ++g) {
      const bool nonzero = (words[g / 64] >> (g % 64)) & 1;
      PutElem<U>(dst, g, nonzero ? buf[k] : U{0});
      k += nonzero;
    }
  }
  return CheckPlaneEnd(plane, size, pos);
}

template <typename U>
absl::Status JoinAvx2(const uint8_t* syms, size_t nnz, const uint8_t* plane, size_t size,
                      const QuantParams& q, const uint64_t* bitmap, size_t n, uint8_t* out,
                      bool pdep) {
  const bool lossless = q.zero_test == ~uint32_t{0};
  if (lossless && q.mant_bits == 23) {
    return JoinAvx2Typed<U, FieldPath::kTriples>(syms, nnz, plane, size, q, bitmap, n, out);
  }
  if (lossless && q.mant_bits == 7) {
    return JoinAvx2Typed<U, FieldPath::kBytes>(syms, nnz, plane, size, q, bitmap, n, out);
  }
  // Fields of <= 8 bits, where the widest ordinary field has width_cap + 1 bits (and every
  // dtype's W >= 7, which the byte layout needs).
  if (pdep && q.width_cap <= 7) {
    return JoinAvx2Typed<U, FieldPath::kBitsPdep>(syms, nnz, plane, size, q, bitmap, n, out);
  }
  return JoinAvx2Typed<U, FieldPath::kBits>(syms, nnz, plane, size, q, bitmap, n, out);
}

}  // namespace

absl::Status JoinElementsAvx2(DType dtype, const uint8_t* syms, size_t nnz,
                              absl::Span<const uint8_t> plane, const QuantParams& q,
                              const uint64_t* bitmap, size_t n, void* out, bool pdep) {
  uint8_t* o = static_cast<uint8_t*>(out);
  if (dtype == DType::kF32) {
    return JoinAvx2<uint32_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o, pdep);
  }
  return JoinAvx2<uint16_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o, pdep);
}

}  // namespace gcomp::codec::internal

#endif  // __x86_64__
