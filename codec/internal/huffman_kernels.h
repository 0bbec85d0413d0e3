// Pieces of the exponent-stream coder that its scalar, AVX2 and AVX-512 versions share
// (huffman_scalar.cc, huffman_avx2.cc, huffman_avx512.cc), and the per-level entry points
// that huffman.cc dispatches to. Include only from those files.
#ifndef GCOMP_CODEC_INTERNAL_HUFFMAN_KERNELS_H_
#define GCOMP_CODEC_INTERNAL_HUFFMAN_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "codec/internal/bits.h"
#include "codec/internal/huffman.h"

namespace gcomp::codec::internal {

// Code words with their lengths packed for one load: bits 0-15 code, 16-23 length.
inline void PackedWords(const HuffmanCode& code, uint32_t word[256]) {
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

// Codes in[from, to) one symbol per put and closes the stream; returns its byte size.
template <typename Writer>
inline uint32_t FinishStream(Writer w, const uint8_t* in, size_t from, size_t to,
                             const uint32_t* word) {
  for (size_t k = from; k < to; ++k) {
    const uint32_t c = word[in[k]];
    w.Put(c & 0xffff, c >> 16);
    if constexpr (std::is_same_v<Writer, BitWriter>) w.Flush();
  }
  return static_cast<uint32_t>(w.Finish());
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

// Code the planned streams (scratch filled, `out` not yet joined) and set sizes[s] to
// stream s's byte size.
void EncodePlanScalar(const StreamPlan& plan, const HuffmanCode& code, uint32_t sizes[kNumStreams]);
#if defined(__x86_64__)
// The vector versions look codes up in tables of the windows' symbols. Call them only at a
// level MaxVectorLevel() allows. AVX2: 1 to 4 windows of 16.
void EncodePlanAvx2(const StreamPlan& plan, const SymbolWindows& windows, const HuffmanCode& code,
                    uint32_t sizes[kNumStreams]);
// 1 or 2 windows of 64.
void EncodePlanAvx512(const StreamPlan& plan, const SymbolWindows& windows, const HuffmanCode& code,
                      uint32_t sizes[kNumStreams]);
// CountSymbols by byte compares when the symbols span few values, else the scalar counts.
void CountSymbolsAvx2(const uint8_t* syms, size_t n, uint64_t freq[256]);
#endif

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_HUFFMAN_KERNELS_H_
