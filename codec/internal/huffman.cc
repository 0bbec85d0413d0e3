#include "codec/internal/huffman.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/internal/bits.h"

namespace gcomp::codec::internal {
namespace {

// Plain Huffman lengths by the two-queue method over leaves sorted by (freq, symbol), so the
// result depends only on the frequencies.
void HuffmanLengths(const std::vector<std::pair<uint64_t, int>>& leaves, uint8_t* len) {
  const size_t m = leaves.size();
  std::vector<uint64_t> weight(2 * m);
  std::vector<int> parent(2 * m, -1);
  for (size_t i = 0; i < m; ++i) weight[i] = leaves[i].first;
  size_t next_leaf = 0, next_inner = m, end_inner = m;
  auto pop = [&]() -> size_t {
    if (next_leaf < m && (next_inner == end_inner || weight[next_leaf] <= weight[next_inner])) {
      return next_leaf++;
    }
    return next_inner++;
  };
  for (size_t k = 0; k + 1 < m; ++k) {
    size_t a = pop(), b = pop();
    weight[end_inner] = weight[a] + weight[b];
    parent[a] = parent[b] = static_cast<int>(end_inner);
    ++end_inner;
  }
  // Depths: the root is the last inner node; parents always come after children.
  std::vector<int> depth(2 * m, 0);
  for (size_t i = end_inner - 1; i-- > 0;) depth[i] = depth[parent[i]] + 1;
  for (size_t i = 0; i < m; ++i) len[leaves[i].second] = static_cast<uint8_t>(depth[i]);
}

uint16_t Reverse(uint16_t code, int len) {
  uint16_t r = 0;
  for (int i = 0; i < len; ++i) r |= ((code >> i) & 1) << (len - 1 - i);
  return r;
}

}  // namespace

void BuildLengths(const uint64_t* freq, int alphabet, HuffmanCode* code) {
  code->alphabet = alphabet;
  std::memset(code->len, 0, sizeof(code->len));
  std::vector<std::pair<uint64_t, int>> leaves;
  for (int s = 0; s < alphabet; ++s) {
    if (freq[s] > 0) leaves.push_back({freq[s], s});
  }
  code->num_symbols = static_cast<int>(leaves.size());
  code->single_symbol = leaves.size() == 1 ? leaves[0].second : -1;
  if (leaves.size() <= 1) return;  // empty, or one symbol coded in 0 bits
  std::sort(leaves.begin(), leaves.end());
  // Rebuild with flattened frequencies until the cap holds (always reached: 256 <= 2^11).
  for (;;) {
    HuffmanLengths(leaves, code->len);
    int max_len = 0;
    for (const auto& leaf : leaves) max_len = std::max<int>(max_len, code->len[leaf.second]);
    if (max_len <= kMaxCodeLen) return;
    for (auto& leaf : leaves) leaf.first = (leaf.first + 1) / 2;
    std::sort(leaves.begin(), leaves.end());
  }
}

void AssignCodes(HuffmanCode* code) {
  std::memset(code->code, 0, sizeof(code->code));
  int count[kMaxCodeLen + 2] = {};
  for (int s = 0; s < code->alphabet; ++s) ++count[code->len[s]];
  count[0] = 0;
  uint32_t next[kMaxCodeLen + 2] = {};
  uint32_t c = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    c = (c + count[l - 1]) << 1;
    next[l] = c;
  }
  for (int s = 0; s < code->alphabet; ++s) {
    int l = code->len[s];
    if (l > 0) code->code[s] = Reverse(static_cast<uint16_t>(next[l]++), l);
  }
}

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
  int lo = code.single_symbol, hi = code.single_symbol;
  if (code.num_symbols != 1) {
    lo = hi = -1;
    for (int s = 0; s < code.alphabet; ++s) {
      if (code.len[s] > 0) {
        if (lo < 0) lo = s;
        hi = s;
      }
    }
  }
  out->push_back(static_cast<char>(lo));
  out->push_back(static_cast<char>(hi - lo));
  for (int s = lo; s <= hi; s += 2) {
    uint8_t b = code.len[s] | ((s + 1 <= hi ? code.len[s + 1] : 0) << 4);
    out->push_back(static_cast<char>(b));
  }
}

absl::Status ParseTable(absl::Span<const uint8_t> bytes, int alphabet, HuffmanCode* code) {
  code->alphabet = alphabet;
  code->single_symbol = -1;
  std::memset(code->len, 0, sizeof(code->len));
  if (bytes.size() < 2) return absl::DataLossError("code table: too short");
  const int lo = bytes[0];
  const int count = bytes[1] + 1;
  if (lo + count > alphabet) {
    return absl::DataLossError(absl::StrCat("code table: symbols ", lo, "..", lo + count - 1,
                                            " outside the alphabet of ", alphabet));
  }
  if (bytes.size() != 2 + static_cast<size_t>((count + 1) / 2)) {
    return absl::DataLossError("code table: size does not match its symbol count");
  }
  uint32_t kraft = 0;
  int present = 0;
  for (int i = 0; i < count; ++i) {
    int l = (bytes[2 + i / 2] >> (4 * (i & 1))) & 15;
    if (l > kMaxCodeLen) return absl::DataLossError("code table: code length above 11");
    code->len[lo + i] = static_cast<uint8_t>(l);
    if (l > 0) {
      kraft += 1u << (kMaxCodeLen - l);
      ++present;
    }
  }
  if (count % 2 == 1 && (bytes.back() >> 4) != 0) {
    return absl::DataLossError("code table: nonzero padding nibble");
  }
  if (count == 1 && present == 0) {
    code->num_symbols = 1;  // single-symbol code: 0 bits per symbol
    code->single_symbol = lo;
    return absl::OkStatus();
  }
  if (present < 2 || kraft != (1u << kMaxCodeLen)) {
    return absl::DataLossError("code table: lengths do not form a complete prefix code");
  }
  code->num_symbols = present;
  AssignCodes(code);
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

void EncodeStreams(const uint8_t* syms, size_t n, const HuffmanCode& code, uint8_t* out,
                   uint32_t sizes[kNumStreams]) {
  // Code words with their lengths packed for one load: bits 0-15 code, 16-23 length.
  uint32_t word[256];
  for (int s = 0; s < 256; ++s) word[s] = code.code[s] | (uint32_t{code.len[s]} << 16);
  // The four writers run in one loop (four independent dependency chains) into their own
  // scratch areas; the streams are then laid end to end.
  thread_local std::vector<uint8_t> scratch;
  size_t offset[kNumStreams];
  size_t total = 0;
  const uint8_t* in[kNumStreams];
  size_t start = 0;
  for (int s = 0; s < kNumStreams; ++s) {
    in[s] = syms + start;
    start += StreamCount(n, s);
    offset[s] = total;
    total += (StreamCount(n, s) * kMaxCodeLen + 7) / 8 + 16;
  }
  if (scratch.size() < total) scratch.resize(total);
  // Stream 0 goes straight to `out`; the others wait in scratch until the sizes before
  // them are known.
  uint8_t* base[kNumStreams] = {out, scratch.data() + offset[1], scratch.data() + offset[2],
                                scratch.data() + offset[3]};
  // No pointer to a writer escapes, so each stays in registers.
  BitWriter w0(base[0]), w1(base[1]), w2(base[2]), w3(base[3]);
  const size_t q = n / kNumStreams;  // every stream holds at least q symbols
#define GCOMP_PUT(w, x)                         \
  do {                                          \
    const uint32_t c = word[x];                 \
    (w).Put(c & 0xffff, c >> 16);               \
  } while (0)
  size_t i = 0;
  for (; i + 4 <= q; i += 4) {  // 4 codes of <= 11 bits per flush
    for (size_t k = 0; k < 4; ++k) {
      GCOMP_PUT(w0, in[0][i + k]);
      GCOMP_PUT(w1, in[1][i + k]);
      GCOMP_PUT(w2, in[2][i + k]);
      GCOMP_PUT(w3, in[3][i + k]);
    }
    w0.Flush();
    w1.Flush();
    w2.Flush();
    w3.Flush();
  }
  auto finish = [&](BitWriter w, int s) {
    for (size_t k = i; k < StreamCount(n, s); ++k) {
      GCOMP_PUT(w, in[s][k]);
      w.Flush();
    }
    return static_cast<uint32_t>(w.Finish());
  };
#undef GCOMP_PUT
  sizes[0] = finish(w0, 0);
  sizes[1] = finish(w1, 1);
  sizes[2] = finish(w2, 2);
  sizes[3] = finish(w3, 3);
  uint8_t* p = out + sizes[0];
  for (int s = 1; s < kNumStreams; ++s) {
    std::memcpy(p, base[s], sizes[s]);
    p += sizes[s];
  }
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
#define GCOMP_REFILL(p, b, c)   \
  do {                          \
    b |= Load64(p) << c;        \
    p += (63 - c) >> 3;         \
    c |= 56;                    \
  } while (0)
#define GCOMP_DECODE(p, b, c, o)                        \
  do {                                                  \
    const uint64_t e = multi[b & kMask];                \
    Store32(o, static_cast<uint32_t>(e));               \
    o += (e >> 40) & 0xff;                              \
    b >>= (e >> 32) & 0xff;                             \
    c -= (e >> 32) & 0xff;                              \
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
