// The exponent-stream encoder with AVX-512 (F, BW, VL, VBMI, VBMI2): one vpermi2b looks up
// 64 symbols in a 128-entry table, and with 64-bit puts most runs of 16 codes (about 40
// bits in near-lossless blocks) take one put. Each function carries its target attribute,
// so this file builds for any x86-64 CPU and its code runs only where cpu.cc found AVX-512.
#include <cstddef>
#include <cstdint>

#include "codec/internal/bits.h"
#include "codec/internal/cpu.h"
#include "codec/internal/huffman.h"
#include "codec/internal/huffman_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC diagnostic push  // GCC 12's AVX-512 headers warn about their own placeholders
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace gcomp::codec::internal {
namespace {

// 32 lanes of (code | length << 12) -> 8 lanes of 4 codes (<= 44 bits) and 8 lanes of their
// total lengths.
__attribute__((target(GCOMP_TARGET_AVX512))) inline void ConcatFours512(__m512i v, __m512i* code4,
                                                                        __m512i* len4) {
  const __m512i lo16 = _mm512_set1_epi32(0xffff);
  const __m512i lo32 = _mm512_set1_epi64(0xffffffff);
  __m512i len = _mm512_srli_epi16(v, 12);
  __m512i code = _mm512_and_si512(v, _mm512_set1_epi16(0x0fff));
  __m512i first = _mm512_and_si512(len, lo16);
  code = _mm512_or_si512(_mm512_and_si512(code, lo16),
                         _mm512_sllv_epi32(_mm512_srli_epi32(code, 16), first));
  len = _mm512_add_epi32(first, _mm512_srli_epi32(len, 16));
  first = _mm512_and_si512(len, lo32);
  *code4 = _mm512_or_si512(_mm512_and_si512(code, lo32),
                           _mm512_sllv_epi64(_mm512_srli_epi64(code, 32), first));
  *len4 = _mm512_add_epi64(first, _mm512_srli_epi64(len, 32));
}

// The same with each total length in bits 56-63 of its codes' lane: ConcatCodes on 512 bits.
__attribute__((target(GCOMP_TARGET_AVX512))) inline __m512i ConcatCodes512(__m512i v) {
  __m512i code, len;
  ConcatFours512(v, &code, &len);
  return _mm512_or_si512(code, _mm512_slli_epi64(len, 56));
}

// Adjacent 64-bit lanes of 4 codes (c) and their lengths (l) joined in pairs within each
// 128-bit lane: lane 0 of each pair gets 8 codes, lane 1 is left as it was.
__attribute__((always_inline, target(GCOMP_TARGET_AVX512))) inline void JoinFours512(__m512i c,
                                                                                     __m512i l,
                                                                                     __m512i* code,
                                                                                     __m512i* len) {
  *code = _mm512_or_si512(c, _mm512_sllv_epi64(_mm512_bsrli_epi128(c, 8), l));
  *len = _mm512_add_epi64(l, _mm512_bsrli_epi128(l, 8));
}

// The same from 4-code chunks of (code | length << 56).
__attribute__((always_inline, target(GCOMP_TARGET_AVX512))) inline void JoinFours512(__m512i four,
                                                                                     __m512i* code,
                                                                                     __m512i* len) {
  JoinFours512(_mm512_and_si512(four, _mm512_set1_epi64((int64_t{1} << 56) - 1)),
               _mm512_srli_epi64(four, 56), code, len);
}

// Table indices of 64 symbols x for two windows of 64 at a and b: x - a where that is below
// 64, else x - b + 64 (b_less_64 holds b - 64). With one window (kTwo false) just x - a.
template <bool kTwo>
__attribute__((always_inline, target(GCOMP_TARGET_AVX512))) inline __m512i WindowIndex(
    __m512i x, __m512i a, __m512i b_less_64) {
  const __m512i idx = _mm512_sub_epi8(x, a);
  if constexpr (!kTwo) return idx;
  const __mmask64 second = _mm512_cmpge_epu8_mask(idx, _mm512_set1_epi8(64));
  return _mm512_mask_sub_epi8(idx, second, x, b_less_64);
}

// The usual case of PiecesOf64 + PutPieces: when all four runs of 16 codes fit in 64 bits,
// puts them and returns true; otherwise puts nothing and returns false.
template <bool kTwo>
__attribute__((always_inline, target(GCOMP_TARGET_AVX512))) inline bool PutSixteens64(
    const uint8_t* in, __m512i a, __m512i b_less_64, __m512i lo0, __m512i lo1, __m512i hi0,
    __m512i hi1, WordWriter& w) {
  const __m512i idx = WindowIndex<kTwo>(_mm512_loadu_si512(in), a, b_less_64);
  const __m512i lo = _mm512_permutex2var_epi8(lo0, idx, lo1);
  const __m512i hi = _mm512_permutex2var_epi8(hi0, idx, hi1);
  // Fours joined in pairs within each 128-bit lane: codes 0-7 (a) and 8-15 (b) of its 16.
  __m512i c, l, ca, la, cb, lb;
  ConcatFours512(_mm512_unpacklo_epi8(lo, hi), &c, &l);
  JoinFours512(c, l, &ca, &la);
  ConcatFours512(_mm512_unpackhi_epi8(lo, hi), &c, &l);
  JoinFours512(c, l, &cb, &lb);
  const __m512i len = _mm512_add_epi64(la, lb);  // runs in 64-bit lanes 0, 2, 4, 6
  if (_mm512_mask_cmpgt_epu64_mask(0x55, len, _mm512_set1_epi64(64)) != 0) return false;
  alignas(64) uint64_t code_lanes[8], len_lanes[8];
  _mm512_store_si512(code_lanes, _mm512_or_si512(ca, _mm512_sllv_epi64(cb, la)));
  _mm512_store_si512(len_lanes, len);
  for (int k = 0; k < 8; k += 2) w.Put(code_lanes[k], static_cast<unsigned>(len_lanes[k]));
  return true;
}

template <bool kTwo>
__attribute__((target(GCOMP_TARGET_AVX512))) inline void PiecesOf64(const uint8_t* in,
                                                                    __m512i first_base,
                                                                    __m512i b_less_64, __m512i lo0,
                                                                    __m512i lo1, __m512i hi0,
                                                                    __m512i hi1, Pieces<8>* p) {
  const __m512i idx = WindowIndex<kTwo>(_mm512_loadu_si512(in), first_base, b_less_64);
  const __m512i lo = _mm512_permutex2var_epi8(lo0, idx, lo1);
  const __m512i hi = _mm512_permutex2var_epi8(hi0, idx, hi1);
  // unpack works within 128-bit lanes: a holds codes 0-7 of each lane's 16, b codes 8-15.
  const __m512i a = ConcatCodes512(_mm512_unpacklo_epi8(lo, hi));
  const __m512i b = ConcatCodes512(_mm512_unpackhi_epi8(lo, hi));
  _mm512_store_si512(p->four_a, a);
  _mm512_store_si512(p->four_b, b);
  __m512i ca, la, cb, lb;
  JoinFours512(a, &ca, &la);
  JoinFours512(b, &cb, &lb);
  _mm512_store_si512(p->eight_a, ca);
  _mm512_store_si512(p->eight_a_len, la);
  _mm512_store_si512(p->eight_b, cb);
  _mm512_store_si512(p->eight_b_len, lb);
  _mm512_store_si512(p->sixteen, _mm512_or_si512(ca, _mm512_sllv_epi64(cb, la)));
  _mm512_store_si512(p->sixteen_len, _mm512_add_epi64(la, lb));
}

// Codes of window 0's symbols at table entries 0-63, window 1's (where kTwo) at 64-127.
template <bool kTwo>
__attribute__((target(GCOMP_TARGET_AVX512))) void EncodeWindows512(const StreamPlan& plan,
                                                                   const SymbolWindows& windows,
                                                                   const HuffmanCode& code,
                                                                   uint32_t sizes[kNumStreams]) {
  // Per table entry: the code's low byte, and its top 3 bits | length << 4. With one window
  // the second half of the table continues it (its symbols are past the code's last).
  const int a = windows.base[0], b = kTwo ? windows.base[1] : a + 64;
  alignas(64) uint8_t lo_bytes[128] = {}, hi_bytes[128] = {};
  for (int i = 0; i < 128; ++i) {
    const int s = i < 64 ? a + i : b + i - 64;
    if (s >= 256) continue;
    lo_bytes[i] = static_cast<uint8_t>(code.code[s]);
    hi_bytes[i] = static_cast<uint8_t>((code.code[s] >> 8) | (code.len[s] << 4));
  }
  const __m512i lo0 = _mm512_load_si512(lo_bytes), lo1 = _mm512_load_si512(lo_bytes + 64);
  const __m512i hi0 = _mm512_load_si512(hi_bytes), hi1 = _mm512_load_si512(hi_bytes + 64);
  const __m512i a_vec = _mm512_set1_epi8(static_cast<char>(a));
  const __m512i b_less_64 = _mm512_set1_epi8(static_cast<char>(b - 64));
  WordWriter w0(plan.base[0]), w1(plan.base[1]), w2(plan.base[2]), w3(plan.base[3]);
  const size_t q = plan.count[kNumStreams - 1];  // the shortest stream
  Pieces<8> p;
  size_t i = 0;
  WordWriter* const writers[kNumStreams] = {&w0, &w1, &w2, &w3};
  for (; i + 64 <= q; i += 64) {
#pragma GCC unroll 4
    for (int s = 0; s < kNumStreams; ++s) {
      if (__builtin_expect(!PutSixteens64<kTwo>(plan.in[s] + i, a_vec, b_less_64, lo0, lo1, hi0,
                                                hi1, *writers[s]),
                           0)) {
        PiecesOf64<kTwo>(plan.in[s] + i, a_vec, b_less_64, lo0, lo1, hi0, hi1, &p);
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

}  // namespace

void EncodePlanAvx512(const StreamPlan& plan, const SymbolWindows& windows, const HuffmanCode& code,
                      uint32_t sizes[kNumStreams]) {
  // Two windows that touch are one run of 128, as one window is: no index select needed.
  if (windows.count == 1 || windows.base[1] == windows.base[0] + 64) {
    return EncodeWindows512<false>(plan, windows, code, sizes);
  }
  EncodeWindows512<true>(plan, windows, code, sizes);
}

}  // namespace gcomp::codec::internal

#pragma GCC diagnostic pop

#endif  // __x86_64__
