// The exponent-stream passes without vector instructions: symbol counts and stream
// encoding (the reference the vector levels must match byte for byte), and stream
// decoding, which has no vector version (every level runs it).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "codec/internal/bits.h"
#include "codec/internal/huffman.h"
#include "codec/internal/huffman_kernels.h"
#include "format/endian.h"

namespace gcomp::codec::internal {

void EncodePlanScalar(const StreamPlan& plan, const HuffmanCode& code,
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

// `safe` rounds of the unchecked loop over the 4 streams (whose state is read from and
// written back to the arrays): per round, a refill and 4 lookups of <= 11 bits (44 <= 56),
// each yielding up to 4 symbols through `multi` (kMulti) or one through `table`.
template <bool kMulti>
void DecodeRuns(size_t safe, const uint64_t* multi, const uint16_t* table,
                const uint8_t* in[kNumStreams], uint8_t* out[kNumStreams],
                uint64_t buf[kNumStreams], unsigned cnt[kNumStreams]) {
  constexpr uint64_t kMask = kDecodeTableSize - 1;
  const uint8_t *p0 = in[0], *p1 = in[1], *p2 = in[2], *p3 = in[3];
  uint8_t *o0 = out[0], *o1 = out[1], *o2 = out[2], *o3 = out[3];
  uint64_t b0 = buf[0], b1 = buf[1], b2 = buf[2], b3 = buf[3];
  unsigned c0 = cnt[0], c1 = cnt[1], c2 = cnt[2], c3 = cnt[3];
#define GCOMP_REFILL(p, b, c) \
  do {                        \
    b |= format::LoadLE64(p) << c;      \
    p += (63 - c) >> 3;       \
    c |= 56;                  \
  } while (0)
#define GCOMP_DECODE(b, c, o)               \
  do {                                      \
    if constexpr (kMulti) {                 \
      const uint64_t e = multi[b & kMask];  \
      format::StoreLE32(o, static_cast<uint32_t>(e)); \
      o += (e >> 40) & 0xff;                \
      b >>= (e >> 32) & 0xff;               \
      c -= (e >> 32) & 0xff;                \
    } else {                                \
      const uint16_t e = table[b & kMask];  \
      *o++ = static_cast<uint8_t>(e);       \
      b >>= e >> 8;                         \
      c -= e >> 8;                          \
    }                                       \
  } while (0)
  for (size_t k = 0; k < safe; ++k) {
    GCOMP_REFILL(p0, b0, c0);
    GCOMP_REFILL(p1, b1, c1);
    GCOMP_REFILL(p2, b2, c2);
    GCOMP_REFILL(p3, b3, c3);
    for (int t = 0; t < 4; ++t) {
      GCOMP_DECODE(b0, c0, o0);
      GCOMP_DECODE(b1, c1, o1);
      GCOMP_DECODE(b2, c2, o2);
      GCOMP_DECODE(b3, c3, o3);
    }
  }
#undef GCOMP_DECODE
#undef GCOMP_REFILL
  in[0] = p0, in[1] = p1, in[2] = p2, in[3] = p3;
  out[0] = o0, out[1] = o1, out[2] = o2, out[3] = o3;
  buf[0] = b0, buf[1] = b1, buf[2] = b2, buf[3] = b3;
  cnt[0] = c0, cnt[1] = c1, cnt[2] = c2, cnt[3] = c3;
}

}  // namespace

absl::Status DecodeStreams(const absl::Span<const uint8_t> streams[kNumStreams],
                           const uint16_t* table, size_t n, uint8_t* syms) {
  constexpr uint64_t kMask = kDecodeTableSize - 1;
  if ((table[0] >> 8) == 0) {
    // A code of one symbol (length 0): every stream is empty and every symbol that one.
    // The checked loop below would read nothing, one symbol at a time.
    for (int s = 0; s < kNumStreams; ++s) {
      if (!streams[s].empty()) {
        return absl::DataLossError(
            absl::StrCat("exponent stream ", s, " does not end at its last byte"));
      }
    }
    std::memset(syms, static_cast<uint8_t>(table[0]), n);
    return absl::OkStatus();
  }
  // The table of several symbols per lookup costs about as much to build (~25k cycles) as
  // it saves on ~16k symbols; smaller blocks (small tensors, small chunk_bytes) take one
  // symbol per lookup in the same unchecked loop.
  constexpr size_t kMultiTableFrom = 16384;
  const bool use_multi = n >= kMultiTableFrom;
  uint64_t multi[kDecodeTableSize];
  if (use_multi) BuildMultiTable(table, multi);

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
    if (use_multi) {
      DecodeRuns<true>(safe, multi, table, in, out, buf, cnt);
    } else {
      DecodeRuns<false>(safe, multi, table, in, out, buf, cnt);
    }
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
