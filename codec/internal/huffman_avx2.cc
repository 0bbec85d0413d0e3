// The exponent-stream passes with AVX2 (and BMI2): stream encoding by pshufb code lookups,
// 32 symbols a step per stream, and symbol counts by byte compares. Each function carries
// its target attribute, so this file builds for any x86-64 CPU and its code runs only where
// cpu.cc found AVX2.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/internal/bits.h"
#include "codec/internal/huffman.h"
#include "codec/internal/huffman_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace gcomp::codec::internal {
namespace {

// Byte lookup of symbols x in NT 16-byte tables, table k holding the entries of symbols
// base[k] .. base[k] + 15 (repeated in both 128-bit lanes). pshufb yields 0 for an index
// byte with its top bit set; adding 0x70 with unsigned saturation sets it for every index
// outside the 16 entries (x - base[k] wraps to 16 or more below base[k]). The windows do not
// overlap, so at most one table gives a symbol's entry.
template <int NT>
__attribute__((target("avx2"))) inline __m256i LookupBytes(__m256i x, const __m256i* base,
                                                           const __m256i* table) {
  const __m256i bias = _mm256_set1_epi8(0x70);
  __m256i r = _mm256_shuffle_epi8(table[0], _mm256_adds_epu8(_mm256_sub_epi8(x, base[0]), bias));
  for (int k = 1; k < NT; ++k) {
    r = _mm256_or_si256(
        r, _mm256_shuffle_epi8(table[k], _mm256_adds_epu8(_mm256_sub_epi8(x, base[k]), bias)));
  }
  return r;
}

// 16 lanes of (code | length << 12) -> 4 lanes of 4 concatenated codes (<= 44 bits, the first
// code in the low bits) and 4 lanes of their total lengths.
__attribute__((target("avx2"))) inline void ConcatFours(__m256i v, __m256i* code4, __m256i* len4) {
  const __m256i lo16 = _mm256_set1_epi32(0xffff);
  const __m256i lo32 = _mm256_set1_epi64x(0xffffffff);
  __m256i len = _mm256_srli_epi16(v, 12);
  __m256i code = _mm256_and_si256(v, _mm256_set1_epi16(0x0fff));
  __m256i first = _mm256_and_si256(len, lo16);
  code = _mm256_or_si256(_mm256_and_si256(code, lo16),
                         _mm256_sllv_epi32(_mm256_srli_epi32(code, 16), first));
  len = _mm256_add_epi32(first, _mm256_srli_epi32(len, 16));
  first = _mm256_and_si256(len, lo32);
  *code4 = _mm256_or_si256(_mm256_and_si256(code, lo32),
                           _mm256_sllv_epi64(_mm256_srli_epi64(code, 32), first));
  *len4 = _mm256_add_epi64(first, _mm256_srli_epi64(len, 32));
}

// The same with each total length in bits 56-63 of its codes' lane.
__attribute__((target("avx2"))) inline __m256i ConcatCodes(__m256i v) {
  __m256i code, len;
  ConcatFours(v, &code, &len);
  return _mm256_or_si256(code, _mm256_slli_epi64(len, 56));
}

// 4-code chunks joined in pairs within each 128-bit lane: the 8-code code and length in
// 64-bit lane 0 of each 128-bit lane.
__attribute__((target("avx2"))) inline void JoinFours(__m256i c, __m256i l, __m256i* code,
                                                      __m256i* len) {
  *code = _mm256_or_si256(c, _mm256_sllv_epi64(_mm256_bsrli_epi128(c, 8), l));
  *len = _mm256_add_epi64(l, _mm256_bsrli_epi128(l, 8));
}

// The same from 4-code chunks of (code | length << 56).
__attribute__((target("avx2"))) inline void JoinFours(__m256i four, __m256i* code, __m256i* len) {
  JoinFours(_mm256_and_si256(four, _mm256_set1_epi64x((int64_t{1} << 56) - 1)),
            _mm256_srli_epi64(four, 56), code, len);
}

template <int NT>
__attribute__((target("avx2"))) inline void PiecesOf32(const uint8_t* in, const __m256i* base,
                                                       const __m256i* lo_table,
                                                       const __m256i* hi_table, Pieces<4>* p) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  const __m256i lo = LookupBytes<NT>(x, base, lo_table);
  const __m256i hi = LookupBytes<NT>(x, base, hi_table);
  // unpack works within 128-bit lanes: a holds codes 0-7 of each lane's 16, b codes 8-15.
  const __m256i a = ConcatCodes(_mm256_unpacklo_epi8(lo, hi));
  const __m256i b = ConcatCodes(_mm256_unpackhi_epi8(lo, hi));
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->four_a), a);
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->four_b), b);
  __m256i ca, la, cb, lb;
  JoinFours(a, &ca, &la);
  JoinFours(b, &cb, &lb);
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->eight_a), ca);
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->eight_a_len), la);
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->eight_b), cb);
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->eight_b_len), lb);
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->sixteen),
                     _mm256_or_si256(ca, _mm256_sllv_epi64(cb, la)));
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->sixteen_len), _mm256_add_epi64(la, lb));
}

// The usual case of PiecesOf32 + PutPieces: when both runs of 16 codes fit in 64 bits, puts
// them straight from registers and returns true; otherwise puts nothing and returns false.
template <int NT>
__attribute__((target("avx2,bmi2"), always_inline)) inline bool PutSixteens32(
    const uint8_t* in, const __m256i* base, const __m256i* lo_table, const __m256i* hi_table,
    WordWriter& w) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  const __m256i lo = LookupBytes<NT>(x, base, lo_table);
  const __m256i hi = LookupBytes<NT>(x, base, hi_table);
  __m256i code4, len4, ca, la, cb, lb;
  ConcatFours(_mm256_unpacklo_epi8(lo, hi), &code4, &len4);
  JoinFours(code4, len4, &ca, &la);
  ConcatFours(_mm256_unpackhi_epi8(lo, hi), &code4, &len4);
  JoinFours(code4, len4, &cb, &lb);
  const __m256i len = _mm256_add_epi64(la, lb);  // runs in 64-bit lanes 0 and 2
  if (_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpgt_epi64(len, _mm256_set1_epi64x(64)))) &
      5) {
    return false;
  }
  const __m256i code = _mm256_or_si256(ca, _mm256_sllv_epi64(cb, la));
  const __m128i high_code = _mm256_extracti128_si256(code, 1);
  const __m128i high_len = _mm256_extracti128_si256(len, 1);
  w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_castsi256_si128(code))),
        static_cast<unsigned>(_mm_cvtsi128_si64(_mm256_castsi256_si128(len))));
  w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(high_code)),
        static_cast<unsigned>(_mm_cvtsi128_si64(high_len)));
  return true;
}

template <int NT>
__attribute__((target("avx2,bmi2"))) void EncodeWithTables(const StreamPlan& plan,
                                                           const SymbolWindows& windows,
                                                           const HuffmanCode& code,
                                                           uint32_t sizes[kNumStreams]) {
  // Per symbol of window k: the code's low byte, and its top 3 bits | length << 4.
  alignas(32) uint8_t lo_bytes[4][16] = {}, hi_bytes[4][16] = {};
  __m256i lo_table[NT], hi_table[NT], base[NT];
  for (int k = 0; k < NT; ++k) {
    for (int i = 0; i < 16 && windows.base[k] + i < 256; ++i) {
      const int s = windows.base[k] + i;
      lo_bytes[k][i] = static_cast<uint8_t>(code.code[s]);
      hi_bytes[k][i] = static_cast<uint8_t>((code.code[s] >> 8) | (code.len[s] << 4));
    }
    lo_table[k] =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(lo_bytes[k])));
    hi_table[k] =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(hi_bytes[k])));
    base[k] = _mm256_set1_epi8(static_cast<char>(windows.base[k]));
  }
  // No pointer to a writer escapes, so each stays in registers.
  WordWriter w0(plan.base[0]), w1(plan.base[1]), w2(plan.base[2]), w3(plan.base[3]);
  const size_t q = plan.count[kNumStreams - 1];  // the shortest stream
  Pieces<4> p;
  size_t i = 0;
  WordWriter* const writers[kNumStreams] = {&w0, &w1, &w2, &w3};
  for (; i + 32 <= q; i += 32) {
#pragma GCC unroll 4
    for (int s = 0; s < kNumStreams; ++s) {
      if (__builtin_expect(
              !PutSixteens32<NT>(plan.in[s] + i, base, lo_table, hi_table, *writers[s]), 0)) {
        PiecesOf32<NT>(plan.in[s] + i, base, lo_table, hi_table, &p);
        PutPieces(*writers[s], p);
      }
    }
  }
  uint32_t word[256];
  PackedWords(code, word);
  sizes[0] = FinishStream(w0, plan.in[0], i, plan.count[0], word);
  sizes[1] = FinishStream(w1, plan.in[1], i, plan.count[1], word);
  sizes[2] = FinishStream(w2, plan.in[2], i, plan.count[2], word);
  sizes[3] = FinishStream(w3, plan.in[3], i, plan.count[3], word);
}

// Symbol counts by byte compares: per pass K symbol values, each with a vector of 32 byte
// counters (emptied into 64-bit totals before they can wrap). Cheaper than table increments
// when the symbols span few values, as near-lossless blocks do (about 2 - A). The counters
// are GCC vector types: with intrinsics on an array of __m256i, GCC copied every counter
// between registers on each step (8 moves per 16 useful instructions).
// Unsigned: a counter at 127 taking one more must wrap, not overflow a signed char.
using Bytes32 = unsigned char __attribute__((vector_size(32)));

template <int K>
__attribute__((target("avx2"))) void CountPassAvx2(const uint8_t* syms, size_t blocks, int first,
                                                   uint64_t* freq) {
  Bytes32 acc[K], value[K];
  uint64_t total[K] = {};
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k) value[k] = (Bytes32)_mm256_set1_epi8(static_cast<char>(first + k));
  for (size_t b = 0; b < blocks;) {
    const size_t end = std::min(blocks, b + 255);
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) acc[k] = Bytes32{};
    for (; b < end; ++b) {
      Bytes32 x;
      std::memcpy(&x, syms + 32 * b, sizeof(x));
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) acc[k] -= (Bytes32)(x == value[k]);  // a match is 0xff
    }
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) {
      const __m256i sums = _mm256_sad_epu8((__m256i)acc[k], _mm256_setzero_si256());
      total[k] += static_cast<uint64_t>(_mm256_extract_epi64(sums, 0)) +
                  static_cast<uint64_t>(_mm256_extract_epi64(sums, 1)) +
                  static_cast<uint64_t>(_mm256_extract_epi64(sums, 2)) +
                  static_cast<uint64_t>(_mm256_extract_epi64(sums, 3));
    }
  }
  for (int k = 0; k < K; ++k) freq[first + k] += total[k];
}

// Smallest and largest of syms[0, 32 * blocks), and the largest below 255 (0 if none):
// Inf and NaN of f32 and bf16 have symbol 255, far above the finite exponents of a block.
__attribute__((target("avx2"))) void SymbolRangeAvx2(const uint8_t* syms, size_t blocks, int* lo,
                                                     int* hi, int* hi_finite) {
  const __m256i all = _mm256_set1_epi8(-1);
  __m256i mn = all, mx = _mm256_setzero_si256(), mx_finite = mx;
  for (size_t b = 0; b < blocks; ++b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(syms + 32 * b));
    mn = _mm256_min_epu8(mn, x);
    mx = _mm256_max_epu8(mx, x);
    mx_finite = _mm256_max_epu8(mx_finite, _mm256_andnot_si256(_mm256_cmpeq_epi8(x, all), x));
  }
  alignas(32) uint8_t a[32], b[32], c[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), mn);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), mx);
  _mm256_store_si256(reinterpret_cast<__m256i*>(c), mx_finite);
  *lo = 255;
  *hi = *hi_finite = 0;
  for (int i = 0; i < 32; ++i) {
    *lo = std::min<int>(*lo, a[i]);
    *hi = std::max<int>(*hi, b[i]);
    *hi_finite = std::max<int>(*hi_finite, c[i]);
  }
}

// The vector counts cover syms[0, 32 * blocks) when their values span at most this many.
constexpr int kMaxVectorCountSpan = 24;

}  // namespace

void EncodePlanAvx2(const StreamPlan& plan, const SymbolWindows& windows, const HuffmanCode& code,
                    uint32_t sizes[kNumStreams]) {
  using Encode = void (*)(const StreamPlan&, const SymbolWindows&, const HuffmanCode&, uint32_t*);
  static constexpr Encode kEncode[4] = {EncodeWithTables<1>, EncodeWithTables<2>,
                                        EncodeWithTables<3>, EncodeWithTables<4>};
  kEncode[windows.count - 1](plan, windows, code, sizes);
}

void CountSymbolsAvx2(const uint8_t* syms, size_t n, uint64_t freq[256]) {
  const size_t blocks = n / 32;
  if (blocks > 0) {
    int lo, hi, hi_finite;
    SymbolRangeAvx2(syms, blocks, &lo, &hi, &hi_finite);
    // A span too wide only because of symbol 255 is counted as [lo, hi_finite] and 255 alone.
    const bool apart = hi == 255 && lo < 255 && hi - lo >= kMaxVectorCountSpan &&
                       hi_finite - lo < kMaxVectorCountSpan;
    if (hi - lo < kMaxVectorCountSpan || apart) {
      CountSymbolsScalar(syms + 32 * blocks, n - 32 * blocks, freq);
      // Passes of 8 symbol values, then one of the 0-7 left.
      using Pass = void (*)(const uint8_t*, size_t, int, uint64_t*);
      static constexpr Pass kPass[8] = {nullptr,          CountPassAvx2<1>, CountPassAvx2<2>,
                                        CountPassAvx2<3>, CountPassAvx2<4>, CountPassAvx2<5>,
                                        CountPassAvx2<6>, CountPassAvx2<7>};
      const int last = apart ? hi_finite : hi;
      int first = lo;
      for (; first + 8 <= last + 1; first += 8) CountPassAvx2<8>(syms, blocks, first, freq);
      if (first <= last) kPass[last + 1 - first](syms, blocks, first, freq);
      if (apart) CountPassAvx2<1>(syms, blocks, 255, freq);
      return;
    }
  }
  CountSymbolsScalar(syms, n, freq);
}

}  // namespace gcomp::codec::internal

#endif  // __x86_64__
