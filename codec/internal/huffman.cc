#include "codec/internal/huffman.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/internal/bits.h"
#include "codec/internal/cpu.h"
#include "format/huffman_code.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcomp::codec::internal {

void BuildLengths(const uint64_t* freq, int alphabet, HuffmanCode* code) {
  code->alphabet = alphabet;
  format::HuffmanWork work;
  code->num_symbols = format::BuildLengths(freq, alphabet, work, code->len, &code->single_symbol);
}

void AssignCodes(HuffmanCode* code) { format::AssignCodes(code->len, code->alphabet, code->code); }

uint64_t CodedBits(const HuffmanCode& code, const uint64_t* freq) {
  uint64_t bits = 0;
  for (int s = 0; s < code.alphabet; ++s) {
    if (freq[s] == 0) continue;
    if (code.num_symbols == 1) {
      if (s != code.single_symbol) return UINT64_MAX;
    } else if (code.len[s] == 0) {
      return UINT64_MAX;
    }
    bits += freq[s] * code.len[s];
  }
  return bits;
}

void SerializeTable(const HuffmanCode& code, std::string* out) {
  int lo = 0, hi = 0;
  format::TableRange(code.len, code.alphabet, code.num_symbols == 1 ? code.single_symbol : -1,
                     &lo, &hi);
  out->push_back(static_cast<char>(lo));
  out->push_back(static_cast<char>(hi - lo));
  for (int s = lo; s <= hi; s += 2) {
    uint8_t b = code.len[s] | ((s + 1 <= hi ? code.len[s + 1] : 0) << 4);
    out->push_back(static_cast<char>(b));
  }
}

absl::Status ParseTable(absl::Span<const uint8_t> bytes, int alphabet, HuffmanCode* code) {
  code->alphabet = alphabet;
  int present = 0;
  const format::TableError error = format::ParseTable(bytes.data(), bytes.size(), alphabet,
                                                      code->len, &code->single_symbol, &present);
  switch (error) {
    case format::TableError::kOk:
      break;
    case format::TableError::kTooShort:
      return absl::DataLossError("code table: too short");
    case format::TableError::kOutsideAlphabet:
      return absl::DataLossError(absl::StrCat("code table: symbols ", int{bytes[0]}, "..",
                                              int{bytes[0]} + int{bytes[1]},
                                              " outside the alphabet of ", alphabet));
    case format::TableError::kSizeMismatch:
      return absl::DataLossError("code table: size does not match its symbol count");
    case format::TableError::kLengthTooLong:
      return absl::DataLossError("code table: code length above 11");
    case format::TableError::kBadPadding:
      return absl::DataLossError("code table: nonzero padding nibble");
    case format::TableError::kIncomplete:
      return absl::DataLossError("code table: lengths do not form a complete prefix code");
  }
  code->num_symbols = present;
  if (code->single_symbol < 0) AssignCodes(code);
  return absl::OkStatus();
}

void BuildDecodeTable(const HuffmanCode& code, uint16_t* table) {
  if (code.num_symbols == 1) {
    std::fill(table, table + kDecodeTableSize, static_cast<uint16_t>(code.single_symbol));
    return;
  }
  for (int s = 0; s < code.alphabet; ++s) {
    int l = code.len[s];
    if (l == 0) continue;
    for (uint32_t j = code.code[s]; j < kDecodeTableSize; j += 1u << l) {
      table[j] = static_cast<uint16_t>(s | (l << 8));
    }
  }
}

namespace {

// Code words with their lengths packed for one load: bits 0-15 code, 16-23 length.
void PackedWords(const HuffmanCode& code, uint32_t word[256]) {
  for (int s = 0; s < 256; ++s) word[s] = code.code[s] | (uint32_t{code.len[s]} << 16);
}

// Where each of the 4 streams starts in syms and in the scratch area the writers use; stream
// 0 is written straight to `out`, the others wait in scratch until the sizes before them
// are known.
struct StreamPlan {
  const uint8_t* in[kNumStreams];
  size_t count[kNumStreams];
  uint8_t* base[kNumStreams];
};
StreamPlan PlanStreams(const uint8_t* syms, size_t n, uint8_t* out) {
  thread_local std::vector<uint8_t> scratch;
  StreamPlan plan;
  size_t offset[kNumStreams];
  size_t total = 0, start = 0;
  for (int s = 0; s < kNumStreams; ++s) {
    plan.in[s] = syms + start;
    plan.count[s] = StreamCount(n, s);
    start += plan.count[s];
    offset[s] = total;
    total += (plan.count[s] * kMaxCodeLen + 7) / 8 + 16;
  }
  if (scratch.size() < total) scratch.resize(total);
  plan.base[0] = out;
  for (int s = 1; s < kNumStreams; ++s) plan.base[s] = scratch.data() + offset[s];
  return plan;
}

// Codes in[from, to) one symbol per put and closes the stream; returns its byte size.
template <typename Writer>
uint32_t FinishStream(Writer w, const uint8_t* in, size_t from, size_t to, const uint32_t* word) {
  for (size_t k = from; k < to; ++k) {
    const uint32_t c = word[in[k]];
    w.Put(c & 0xffff, c >> 16);
    if constexpr (std::is_same_v<Writer, BitWriter>) w.Flush();
  }
  return static_cast<uint32_t>(w.Finish());
}

// Lays streams 1-3 after stream 0.
void JoinStreams(const StreamPlan& plan, uint8_t* out, const uint32_t sizes[kNumStreams]) {
  uint8_t* p = out + sizes[0];
  for (int s = 1; s < kNumStreams; ++s) {
    std::memcpy(p, plan.base[s], sizes[s]);
    p += sizes[s];
  }
}

#if defined(__x86_64__)

// Byte lookup in a table of 16 * NT entries held as NT 16-byte tables (each repeated in
// both 128-bit lanes). pshufb yields 0 for an index byte with its top bit set; adding 0x70
// with unsigned saturation sets it for every index outside the current 16 entries.
template <int NT>
__attribute__((target("avx2"))) inline __m256i LookupBytes(__m256i idx, const __m256i* table) {
  const __m256i bias = _mm256_set1_epi8(0x70);
  __m256i r = _mm256_shuffle_epi8(table[0], _mm256_adds_epu8(idx, bias));
  for (int k = 1; k < NT; ++k) {
    idx = _mm256_sub_epi8(idx, _mm256_set1_epi8(16));
    r = _mm256_or_si256(r, _mm256_shuffle_epi8(table[k], _mm256_adds_epu8(idx, bias)));
  }
  return r;
}

// 16 lanes of (code | length << 12) -> 4 lanes of 4 concatenated codes (<= 44 bits, the first
// code in the low bits) with their total length in bits 56-63.
__attribute__((target("avx2"))) inline __m256i ConcatCodes(__m256i v) {
  const __m256i lo16 = _mm256_set1_epi32(0xffff);
  const __m256i lo32 = _mm256_set1_epi64x(0xffffffff);
  __m256i len = _mm256_srli_epi16(v, 12);
  __m256i code = _mm256_and_si256(v, _mm256_set1_epi16(0x0fff));
  __m256i first = _mm256_and_si256(len, lo16);
  code = _mm256_or_si256(_mm256_and_si256(code, lo16),
                         _mm256_sllv_epi32(_mm256_srli_epi32(code, 16), first));
  len = _mm256_add_epi32(first, _mm256_srli_epi32(len, 16));
  first = _mm256_and_si256(len, lo32);
  code = _mm256_or_si256(_mm256_and_si256(code, lo32),
                         _mm256_sllv_epi64(_mm256_srli_epi64(code, 32), first));
  len = _mm256_add_epi64(first, _mm256_srli_epi64(len, 32));
  return _mm256_or_si256(code, _mm256_slli_epi64(len, 56));
}

// The codes of a run of symbols in three sizes of piece, each 128-bit lane L of the vector
// that made them covering symbols 16L .. 16L + 15: sixteen[2L] (all 16 codes, right when
// sixteen_len[2L] <= 64), eight_a[2L] and eight_b[2L] (codes 0-7 and 8-15, right when
// their length is <= 64), and the 4-code chunks four_a[2L], four_a[2L + 1], four_b[2L],
// four_b[2L + 1] (always right: <= 44 bits, length in bits 56-63). N 64-bit lanes: 4 for
// 32 symbols (AVX2), 8 for 64 (AVX-512).
template <int N>
struct Pieces {
  alignas(64) uint64_t sixteen[N], sixteen_len[N];
  alignas(64) uint64_t eight_a[N], eight_a_len[N], eight_b[N], eight_b_len[N];
  alignas(64) uint64_t four_a[N], four_b[N];
};

// Puts the pieces in symbol order, each run of 16 codes in one put when it fits in 64 bits
// (near-lossless blocks average under 3 bits a code), else in 8s, else in 4s.
template <int N>
__attribute__((always_inline)) inline void PutPieces(WordWriter& w, const Pieces<N>& p) {
  constexpr uint64_t kCodeMask = (uint64_t{1} << 56) - 1;
  for (int k = 0; k < N; k += 2) {
    if (__builtin_expect(p.sixteen_len[k] <= 64, 1)) {
      w.Put(p.sixteen[k], static_cast<unsigned>(p.sixteen_len[k]));
      continue;
    }
    const uint64_t* eights[2] = {p.eight_a, p.eight_b};
    const uint64_t* eight_lens[2] = {p.eight_a_len, p.eight_b_len};
    const uint64_t* fours[2] = {p.four_a, p.four_b};
    for (int h = 0; h < 2; ++h) {
      if (eight_lens[h][k] <= 64) {
        w.Put(eights[h][k], static_cast<unsigned>(eight_lens[h][k]));
      } else {
        w.Put(fours[h][k] & kCodeMask, static_cast<unsigned>(fours[h][k] >> 56));
        w.Put(fours[h][k + 1] & kCodeMask, static_cast<unsigned>(fours[h][k + 1] >> 56));
      }
    }
  }
}

// 4-code chunks (code | length << 56) joined in pairs within each 128-bit lane: the
// 8-code code and length in 64-bit lane 0 of each 128-bit lane.
__attribute__((target("avx2"))) inline void JoinFours(__m256i four, __m256i* code, __m256i* len) {
  const __m256i c = _mm256_and_si256(four, _mm256_set1_epi64x((int64_t{1} << 56) - 1));
  const __m256i l = _mm256_srli_epi64(four, 56);
  *code = _mm256_or_si256(c, _mm256_sllv_epi64(_mm256_bsrli_epi128(c, 8), l));
  *len = _mm256_add_epi64(l, _mm256_bsrli_epi128(l, 8));
}

template <int NT>
__attribute__((target("avx2"))) inline void PiecesOf32(const uint8_t* in, __m256i min_sym,
                                                       const __m256i* lo_table,
                                                       const __m256i* hi_table, Pieces<4>* p) {
  const __m256i idx =
      _mm256_sub_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)), min_sym);
  const __m256i lo = LookupBytes<NT>(idx, lo_table);
  const __m256i hi = LookupBytes<NT>(idx, hi_table);
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

template <int NT>
__attribute__((target("avx2,bmi2"))) void EncodeStreamsAvx2(const StreamPlan& plan, int min_sym,
                                                            const HuffmanCode& code,
                                                            uint32_t sizes[kNumStreams]) {
  // Per symbol - min_sym: the code's low byte, and its top 3 bits | length << 4.
  alignas(32) uint8_t lo_bytes[4][16] = {}, hi_bytes[4][16] = {};
  for (int i = 0; i < 16 * NT && min_sym + i < 256; ++i) {
    const int s = min_sym + i;
    lo_bytes[i / 16][i % 16] = static_cast<uint8_t>(code.code[s]);
    hi_bytes[i / 16][i % 16] = static_cast<uint8_t>((code.code[s] >> 8) | (code.len[s] << 4));
  }
  __m256i lo_table[NT], hi_table[NT];
  for (int k = 0; k < NT; ++k) {
    lo_table[k] =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(lo_bytes[k])));
    hi_table[k] =
        _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(hi_bytes[k])));
  }
  const __m256i min_vec = _mm256_set1_epi8(static_cast<char>(min_sym));
  // No pointer to a writer escapes, so each stays in registers.
  WordWriter w0(plan.base[0]), w1(plan.base[1]), w2(plan.base[2]), w3(plan.base[3]);
  const size_t q = plan.count[kNumStreams - 1];  // the shortest stream
  Pieces<4> p;
  size_t i = 0;
  for (; i + 32 <= q; i += 32) {
    PiecesOf32<NT>(plan.in[0] + i, min_vec, lo_table, hi_table, &p);
    PutPieces(w0, p);
    PiecesOf32<NT>(plan.in[1] + i, min_vec, lo_table, hi_table, &p);
    PutPieces(w1, p);
    PiecesOf32<NT>(plan.in[2] + i, min_vec, lo_table, hi_table, &p);
    PutPieces(w2, p);
    PiecesOf32<NT>(plan.in[3] + i, min_vec, lo_table, hi_table, &p);
    PutPieces(w3, p);
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
// when the symbols span few values, as near-lossless blocks do (about 2 - A).
template <int K>
__attribute__((target("avx2"))) void CountPassAvx2(const uint8_t* syms, size_t blocks, int first,
                                                   uint64_t* freq) {
  __m256i acc[K], value[K];
  uint64_t total[K] = {};
#pragma GCC unroll 8
  for (int k = 0; k < K; ++k) value[k] = _mm256_set1_epi8(static_cast<char>(first + k));
  for (size_t b = 0; b < blocks;) {
    const size_t end = std::min(blocks, b + 255);
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) acc[k] = _mm256_setzero_si256();
    for (; b < end; ++b) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(syms + 32 * b));
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k) {
        acc[k] = _mm256_sub_epi8(acc[k], _mm256_cmpeq_epi8(x, value[k]));
      }
    }
#pragma GCC unroll 8
    for (int k = 0; k < K; ++k) {
      const __m256i sums = _mm256_sad_epu8(acc[k], _mm256_setzero_si256());
      total[k] += static_cast<uint64_t>(_mm256_extract_epi64(sums, 0)) +
                  static_cast<uint64_t>(_mm256_extract_epi64(sums, 1)) +
                  static_cast<uint64_t>(_mm256_extract_epi64(sums, 2)) +
                  static_cast<uint64_t>(_mm256_extract_epi64(sums, 3));
    }
  }
  for (int k = 0; k < K; ++k) freq[first + k] += total[k];
}

// Smallest and largest of syms[0, 32 * blocks).
__attribute__((target("avx2"))) void SymbolRangeAvx2(const uint8_t* syms, size_t blocks, int* lo,
                                                     int* hi) {
  __m256i mn = _mm256_set1_epi8(-1), mx = _mm256_setzero_si256();
  for (size_t b = 0; b < blocks; ++b) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(syms + 32 * b));
    mn = _mm256_min_epu8(mn, x);
    mx = _mm256_max_epu8(mx, x);
  }
  alignas(32) uint8_t a[32], b[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(a), mn);
  _mm256_store_si256(reinterpret_cast<__m256i*>(b), mx);
  *lo = 255;
  *hi = 0;
  for (int i = 0; i < 32; ++i) {
    *lo = std::min<int>(*lo, a[i]);
    *hi = std::max<int>(*hi, b[i]);
  }
}

// The vector counts cover syms[0, 32 * blocks) when their values span at most this many.
constexpr int kMaxVectorCountSpan = 24;

// AVX-512 (VBMI): one vpermi2b looks up 64 symbols in a 128-entry table, and with 64-bit
// puts most runs of 16 codes (about 40 bits in near-lossless blocks) take one put.
#pragma GCC diagnostic push  // GCC 12's AVX-512 headers warn about their own placeholders
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 32 lanes of (code | length << 12) -> 8 lanes of 4 codes (<= 44 bits) with their length in
// bits 56-63: ConcatCodes on 512 bits.
__attribute__((target(GCOMP_TARGET_AVX512))) inline __m512i ConcatCodes512(__m512i v) {
  const __m512i lo16 = _mm512_set1_epi32(0xffff);
  const __m512i lo32 = _mm512_set1_epi64(0xffffffff);
  __m512i len = _mm512_srli_epi16(v, 12);
  __m512i code = _mm512_and_si512(v, _mm512_set1_epi16(0x0fff));
  __m512i first = _mm512_and_si512(len, lo16);
  code = _mm512_or_si512(_mm512_and_si512(code, lo16),
                         _mm512_sllv_epi32(_mm512_srli_epi32(code, 16), first));
  len = _mm512_add_epi32(first, _mm512_srli_epi32(len, 16));
  first = _mm512_and_si512(len, lo32);
  code = _mm512_or_si512(_mm512_and_si512(code, lo32),
                         _mm512_sllv_epi64(_mm512_srli_epi64(code, 32), first));
  len = _mm512_add_epi64(first, _mm512_srli_epi64(len, 32));
  return _mm512_or_si512(code, _mm512_slli_epi64(len, 56));
}

__attribute__((target(GCOMP_TARGET_AVX512))) inline void PiecesOf64(const uint8_t* in,
                                                                    __m512i min_sym, __m512i lo0,
                                                                    __m512i lo1, __m512i hi0,
                                                                    __m512i hi1, Pieces<8>* p) {
  const __m512i mask56 = _mm512_set1_epi64((int64_t{1} << 56) - 1);
  const __m512i idx = _mm512_sub_epi8(_mm512_loadu_si512(in), min_sym);
  const __m512i lo = _mm512_permutex2var_epi8(lo0, idx, lo1);
  const __m512i hi = _mm512_permutex2var_epi8(hi0, idx, hi1);
  // unpack works within 128-bit lanes: a holds codes 0-7 of each lane's 16, b codes 8-15.
  const __m512i a = ConcatCodes512(_mm512_unpacklo_epi8(lo, hi));
  const __m512i b = ConcatCodes512(_mm512_unpackhi_epi8(lo, hi));
  _mm512_store_si512(p->four_a, a);
  _mm512_store_si512(p->four_b, b);
  auto eight = [&](__m512i four, __m512i * code, __m512i * len)
      __attribute__((always_inline, target(GCOMP_TARGET_AVX512))) {
    const __m512i c = _mm512_and_si512(four, mask56);
    const __m512i l = _mm512_srli_epi64(four, 56);
    *code = _mm512_or_si512(c, _mm512_sllv_epi64(_mm512_bsrli_epi128(c, 8), l));
    *len = _mm512_add_epi64(l, _mm512_bsrli_epi128(l, 8));
  };
  __m512i ca, la, cb, lb;
  eight(a, &ca, &la);
  eight(b, &cb, &lb);
  _mm512_store_si512(p->eight_a, ca);
  _mm512_store_si512(p->eight_a_len, la);
  _mm512_store_si512(p->eight_b, cb);
  _mm512_store_si512(p->eight_b_len, lb);
  _mm512_store_si512(p->sixteen, _mm512_or_si512(ca, _mm512_sllv_epi64(cb, la)));
  _mm512_store_si512(p->sixteen_len, _mm512_add_epi64(la, lb));
}

__attribute__((target(GCOMP_TARGET_AVX512))) void EncodeStreams512(const StreamPlan& plan,
                                                                   int min_sym,
                                                                   const HuffmanCode& code,
                                                                   uint32_t sizes[kNumStreams]) {
  // Per symbol - min_sym (< 128): the code's low byte, and its top 3 bits | length << 4.
  alignas(64) uint8_t lo_bytes[128] = {}, hi_bytes[128] = {};
  for (int i = 0; i < 128 && min_sym + i < 256; ++i) {
    const int s = min_sym + i;
    lo_bytes[i] = static_cast<uint8_t>(code.code[s]);
    hi_bytes[i] = static_cast<uint8_t>((code.code[s] >> 8) | (code.len[s] << 4));
  }
  const __m512i lo0 = _mm512_load_si512(lo_bytes), lo1 = _mm512_load_si512(lo_bytes + 64);
  const __m512i hi0 = _mm512_load_si512(hi_bytes), hi1 = _mm512_load_si512(hi_bytes + 64);
  const __m512i min_vec = _mm512_set1_epi8(static_cast<char>(min_sym));
  WordWriter w0(plan.base[0]), w1(plan.base[1]), w2(plan.base[2]), w3(plan.base[3]);
  const size_t q = plan.count[kNumStreams - 1];  // the shortest stream
  Pieces<8> p;
  size_t i = 0;
  for (; i + 64 <= q; i += 64) {
    PiecesOf64(plan.in[0] + i, min_vec, lo0, lo1, hi0, hi1, &p);
    PutPieces(w0, p);
    PiecesOf64(plan.in[1] + i, min_vec, lo0, lo1, hi0, hi1, &p);
    PutPieces(w1, p);
    PiecesOf64(plan.in[2] + i, min_vec, lo0, lo1, hi0, hi1, &p);
    PutPieces(w2, p);
    PiecesOf64(plan.in[3] + i, min_vec, lo0, lo1, hi0, hi1, &p);
    PutPieces(w3, p);
  }
  uint32_t word[256];
  PackedWords(code, word);
  sizes[0] = FinishStream(w0, plan.in[0], i, plan.count[0], word);
  sizes[1] = FinishStream(w1, plan.in[1], i, plan.count[1], word);
  sizes[2] = FinishStream(w2, plan.in[2], i, plan.count[2], word);
  sizes[3] = FinishStream(w3, plan.in[3], i, plan.count[3], word);
}

#pragma GCC diagnostic pop

#endif  // __x86_64__

void EncodeStreamsScalarPlan(const StreamPlan& plan, const HuffmanCode& code,
                             uint32_t sizes[kNumStreams]) {
  uint32_t word[256];
  PackedWords(code, word);
  // The four writers run in one loop: four independent dependency chains.
  BitWriter w0(plan.base[0]), w1(plan.base[1]), w2(plan.base[2]), w3(plan.base[3]);
  const size_t q = plan.count[kNumStreams - 1];  // the shortest stream
#define GCOMP_PUT(w, x)           \
  do {                            \
    const uint32_t c = word[x];   \
    (w).Put(c & 0xffff, c >> 16); \
  } while (0)
  size_t i = 0;
  for (; i + 4 <= q; i += 4) {  // 4 codes of <= 11 bits per flush
    for (size_t k = 0; k < 4; ++k) {
      GCOMP_PUT(w0, plan.in[0][i + k]);
      GCOMP_PUT(w1, plan.in[1][i + k]);
      GCOMP_PUT(w2, plan.in[2][i + k]);
      GCOMP_PUT(w3, plan.in[3][i + k]);
    }
    w0.Flush();
    w1.Flush();
    w2.Flush();
    w3.Flush();
  }
#undef GCOMP_PUT
  sizes[0] = FinishStream(w0, plan.in[0], i, plan.count[0], word);
  sizes[1] = FinishStream(w1, plan.in[1], i, plan.count[1], word);
  sizes[2] = FinishStream(w2, plan.in[2], i, plan.count[2], word);
  sizes[3] = FinishStream(w3, plan.in[3], i, plan.count[3], word);
}

}  // namespace

void CountSymbolsScalar(const uint8_t* syms, size_t n, uint64_t freq[256]) {
  // Four tables, so that runs of one symbol do not wait on their own increments.
  uint32_t f[4][256] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++f[0][syms[i]];
    ++f[1][syms[i + 1]];
    ++f[2][syms[i + 2]];
    ++f[3][syms[i + 3]];
  }
  for (; i < n; ++i) ++f[0][syms[i]];
  for (int s = 0; s < 256; ++s) freq[s] = uint64_t{f[0][s]} + f[1][s] + f[2][s] + f[3][s];
}

void CountSymbols(const uint8_t* syms, size_t n, uint64_t freq[256]) {
#if defined(__x86_64__)
  const size_t blocks = n / 32;
  if (MaxVectorLevel() >= VectorLevel::kAvx2 && blocks > 0) {
    int lo, hi;
    SymbolRangeAvx2(syms, blocks, &lo, &hi);
    if (hi - lo < kMaxVectorCountSpan) {
      CountSymbolsScalar(syms + 32 * blocks, n - 32 * blocks, freq);
      // Passes of 8 symbol values, then one of the 0-7 left.
      using Pass = void (*)(const uint8_t*, size_t, int, uint64_t*);
      static constexpr Pass kPass[8] = {nullptr,          CountPassAvx2<1>, CountPassAvx2<2>,
                                        CountPassAvx2<3>, CountPassAvx2<4>, CountPassAvx2<5>,
                                        CountPassAvx2<6>, CountPassAvx2<7>};
      int first = lo;
      for (; first + 8 <= hi + 1; first += 8) CountPassAvx2<8>(syms, blocks, first, freq);
      if (first <= hi) kPass[hi + 1 - first](syms, blocks, first, freq);
      return;
    }
  }
#endif
  CountSymbolsScalar(syms, n, freq);
}

void EncodeStreamsScalar(const uint8_t* syms, size_t n, const HuffmanCode& code, uint8_t* out,
                         uint32_t sizes[kNumStreams]) {
  const StreamPlan plan = PlanStreams(syms, n, out);
  EncodeStreamsScalarPlan(plan, code, sizes);
  JoinStreams(plan, out, sizes);
}

void EncodeStreamsAt(VectorLevel level, const uint8_t* syms, size_t n, const HuffmanCode& code,
                     uint8_t* out, uint32_t sizes[kNumStreams]) {
  const StreamPlan plan = PlanStreams(syms, n, out);
#if defined(__x86_64__)
  // The vector paths look codes up in tables indexed by symbol - lo: 128 entries with
  // AVX-512, 16 * NT with AVX2 (near-lossless blocks span about 2 - A symbols, lossless
  // gradient blocks some 30 to 60).
  int lo = 256, hi = -1;
  for (int s = 0; s < code.alphabet; ++s) {
    if (code.len[s] != 0 || s == code.single_symbol) {
      lo = std::min(lo, s);
      hi = std::max(hi, s);
    }
  }
  if (level > MaxVectorLevel()) level = MaxVectorLevel();
  if (level == VectorLevel::kAvx512 && hi >= lo && hi - lo < 128) {
    EncodeStreams512(plan, lo, code, sizes);
    return JoinStreams(plan, out, sizes);
  }
  if (level >= VectorLevel::kAvx2 && hi >= lo && hi - lo < 64 && n >= 4 * 32) {
    // 16 symbols per lookup table: NT = 1 to 4 tables.
    using Encode = void (*)(const StreamPlan&, int, const HuffmanCode&, uint32_t*);
    static constexpr Encode kEncode[4] = {EncodeStreamsAvx2<1>, EncodeStreamsAvx2<2>,
                                          EncodeStreamsAvx2<3>, EncodeStreamsAvx2<4>};
    kEncode[(hi - lo) / 16](plan, lo, code, sizes);
    return JoinStreams(plan, out, sizes);
  }
#endif
  EncodeStreamsScalarPlan(plan, code, sizes);
  JoinStreams(plan, out, sizes);
}

void EncodeStreams(const uint8_t* syms, size_t n, const HuffmanCode& code, uint8_t* out,
                   uint32_t sizes[kNumStreams]) {
  EncodeStreamsAt(MaxVectorLevel(), syms, n, code, out, sizes);
}

namespace {

// Up to 4 symbols per 11-bit lookup: bytes 0-3 symbols, byte 4 bits used, byte 5 count.
// Gradient exponents average ~2-3 bits, so one lookup usually yields 3-4 symbols.
constexpr int kSymbolsPerEntry = 4;
void BuildMultiTable(const uint16_t* table, uint64_t* multi) {
  for (uint32_t j = 0; j < kDecodeTableSize; ++j) {
    uint64_t syms = 0;
    unsigned used = 0, count = 0;
    while (count < kSymbolsPerEntry) {
      const uint16_t e = table[j >> used];  // bits past the index read as zeros...
      const unsigned len = e >> 8;
      if (used + len > kMaxCodeLen) break;  // ...so a code must end inside the index
      syms |= uint64_t{static_cast<uint8_t>(e)} << (8 * count);
      used += len;
      ++count;
    }
    multi[j] = syms | uint64_t{used} << 32 | uint64_t{count} << 40;
  }
}

}  // namespace

absl::Status DecodeStreams(const absl::Span<const uint8_t> streams[kNumStreams],
                           const uint16_t* table, size_t n, uint8_t* syms) {
  uint64_t multi[kDecodeTableSize];
  BuildMultiTable(table, multi);
  constexpr uint64_t kMask = kDecodeTableSize - 1;

  // Lean reader state (next byte, bit buffer, valid bits) so that the 4 streams fit in
  // registers. The unchecked loop below runs only while every stream has 8 bytes left to
  // load and room for 16 more symbols; the checked BitReader finishes each stream.
  const uint8_t* in[kNumStreams];
  const uint8_t* in_end[kNumStreams];
  uint8_t* out[kNumStreams];
  uint8_t* out_end[kNumStreams];
  uint64_t buf[kNumStreams] = {};
  unsigned cnt[kNumStreams] = {};
  uint8_t* o = syms;
  for (int s = 0; s < kNumStreams; ++s) {
    in[s] = streams[s].data();
    in_end[s] = in[s] + streams[s].size();
    out[s] = o;
    o += StreamCount(n, s);
    out_end[s] = o;
  }
  for (;;) {
    // Iterations that are safe without checks: a refill advances at most 7 bytes, an
    // iteration emits at most 16 symbols.
    size_t safe = SIZE_MAX;
    for (int s = 0; s < kNumStreams; ++s) {
      const ptrdiff_t bytes = in_end[s] - in[s], room = out_end[s] - out[s];
      if (bytes < 8 || room < 16) {
        safe = 0;
        break;
      }
      safe = std::min(safe, std::min<size_t>((bytes - 8) / 7 + 1, room / 16));
    }
    if (safe == 0) break;
    const uint8_t *p0 = in[0], *p1 = in[1], *p2 = in[2], *p3 = in[3];
    uint8_t *o0 = out[0], *o1 = out[1], *o2 = out[2], *o3 = out[3];
    uint64_t b0 = buf[0], b1 = buf[1], b2 = buf[2], b3 = buf[3];
    unsigned c0 = cnt[0], c1 = cnt[1], c2 = cnt[2], c3 = cnt[3];
#define GCOMP_REFILL(p, b, c) \
  do {                        \
    b |= Load64(p) << c;      \
    p += (63 - c) >> 3;       \
    c |= 56;                  \
  } while (0)
#define GCOMP_DECODE(p, b, c, o)          \
  do {                                    \
    const uint64_t e = multi[b & kMask];  \
    Store32(o, static_cast<uint32_t>(e)); \
    o += (e >> 40) & 0xff;                \
    b >>= (e >> 32) & 0xff;               \
    c -= (e >> 32) & 0xff;                \
  } while (0)
    for (size_t k = 0; k < safe; ++k) {
      // 4 lookups of <= 11 bits per refill: 44 <= 56.
      GCOMP_REFILL(p0, b0, c0);
      GCOMP_REFILL(p1, b1, c1);
      GCOMP_REFILL(p2, b2, c2);
      GCOMP_REFILL(p3, b3, c3);
      for (int t = 0; t < 4; ++t) {
        GCOMP_DECODE(p0, b0, c0, o0);
        GCOMP_DECODE(p1, b1, c1, o1);
        GCOMP_DECODE(p2, b2, c2, o2);
        GCOMP_DECODE(p3, b3, c3, o3);
      }
    }
#undef GCOMP_DECODE
#undef GCOMP_REFILL
    in[0] = p0, in[1] = p1, in[2] = p2, in[3] = p3;
    out[0] = o0, out[1] = o1, out[2] = o2, out[3] = o3;
    buf[0] = b0, buf[1] = b1, buf[2] = b2, buf[3] = b3;
    cnt[0] = c0, cnt[1] = c1, cnt[2] = c2, cnt[3] = c3;
  }

  for (int s = 0; s < kNumStreams; ++s) {
    const size_t consumed = static_cast<size_t>(in[s] - streams[s].data()) * 8 - cnt[s];
    BitReader r(streams[s].data(), streams[s].size(), consumed);
    for (uint8_t* q = out[s]; q < out_end[s]; ++q) {
      r.Refill();
      const uint16_t e = table[r.Peek() & kMask];
      *q = static_cast<uint8_t>(e);
      r.Consume(e >> 8);
    }
    if (!r.AtExactEnd()) {
      return absl::DataLossError(
          absl::StrCat("exponent stream ", s, " does not end at its last byte"));
    }
  }
  return absl::OkStatus();
}

}  // namespace gcomp::codec::internal
