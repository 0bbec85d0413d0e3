// Canonical Huffman codes for exponent symbols (construction, serialized tables, decode
// tables), and the choice among the scalar, AVX2 and AVX-512 versions of the stream passes
// (huffman_scalar.cc, huffman_avx2.cc, huffman_avx512.cc).
#include "codec/internal/huffman.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "base/large_buffer.h"
#include "base/reused_per_thread.h"
#include "codec/internal/cpu.h"
#include "codec/internal/huffman_kernels.h"
#include "format/huffman_code.h"

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
  format::WriteTable(code.len, lo, hi, [out](uint8_t b) { out->push_back(static_cast<char>(b)); });
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

// A type of its own: every use of ReusedPerThread<T> with one T shares the object.
struct StreamScratch {
  LargeBuffer buffer;
};

StreamPlan PlanStreams(const uint8_t* syms, size_t n, uint8_t* out) {
  // Never zero-filled and in huge pages where it is large (base/large_buffer.h): streams
  // 1-3 are written before JoinStreams reads them. Kept across threads as the block
  // scratch is (block.cc).
  LargeBuffer& scratch = ReusedPerThread<StreamScratch>::Get().buffer;
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
  uint8_t* const streams = scratch.Reserve(total);
  plan.base[0] = out;
  for (int s = 1; s < kNumStreams; ++s) plan.base[s] = streams + offset[s];
  return plan;
}

// Lays streams 1-3 after stream 0.
void JoinStreams(const StreamPlan& plan, uint8_t* out, const uint32_t sizes[kNumStreams]) {
  uint8_t* p = out + sizes[0];
  for (int s = 1; s < kNumStreams; ++s) {
    std::memcpy(p, plan.base[s], sizes[s]);
    p += sizes[s];
  }
}

}  // namespace

void CountSymbolsAt(VectorLevel level, const uint8_t* syms, size_t n, uint64_t freq[256]) {
#if defined(__x86_64__)
  if (level > MaxVectorLevel()) level = MaxVectorLevel();
  if (level >= VectorLevel::kAvx2) return CountSymbolsAvx2(syms, n, freq);  // AVX-512 too
#endif
  CountSymbolsScalar(syms, n, freq);
}

void CountSymbols(const uint8_t* syms, size_t n, uint64_t freq[256]) {
  CountSymbolsAt(MaxVectorLevel(), syms, n, freq);
}

void EncodeStreamsScalar(const uint8_t* syms, size_t n, const HuffmanCode& code, uint8_t* out,
                         uint32_t sizes[kNumStreams]) {
  const StreamPlan plan = PlanStreams(syms, n, out);
  EncodePlanScalar(plan, code, sizes);
  JoinStreams(plan, out, sizes);
}

SymbolWindows CoverSymbols(const HuffmanCode& code, int width, int max_windows) {
  SymbolWindows w;
  int end = 0;  // symbols below it are covered
  for (int s = 0; s < code.alphabet; ++s) {
    if ((code.len[s] == 0 && s != code.single_symbol) || s < end) continue;
    if (w.count == max_windows) return SymbolWindows();
    w.base[w.count++] = s;
    end = s + width;
  }
  return w;
}

void EncodeStreamsAt(VectorLevel level, const uint8_t* syms, size_t n, const HuffmanCode& code,
                     uint8_t* out, uint32_t sizes[kNumStreams]) {
  const StreamPlan plan = PlanStreams(syms, n, out);
#if defined(__x86_64__)
  // The vector paths look codes up in tables of the symbols' windows: two of 64 with
  // AVX-512, up to four of 16 with AVX2 (near-lossless blocks span about 2 - A symbols, and
  // one more far above for Inf/NaN; lossless gradient blocks some 30 to 60).
  if (level > MaxVectorLevel()) level = MaxVectorLevel();
  if (level == VectorLevel::kAvx512) {
    if (const SymbolWindows w = CoverSymbols(code, 64, 2); w.count > 0) {
      EncodePlanAvx512(plan, w, code, sizes);
      return JoinStreams(plan, out, sizes);
    }
  }
  if (level >= VectorLevel::kAvx2 && n >= 4 * 32) {
    if (const SymbolWindows w = CoverSymbols(code, 16, 4); w.count > 0) {
      EncodePlanAvx2(plan, w, code, sizes);
      return JoinStreams(plan, out, sizes);
    }
  }
#endif
  EncodePlanScalar(plan, code, sizes);
  JoinStreams(plan, out, sizes);
}

void EncodeStreams(const uint8_t* syms, size_t n, const HuffmanCode& code, uint8_t* out,
                   uint32_t sizes[kNumStreams]) {
  EncodeStreamsAt(MaxVectorLevel(), syms, n, code, out, sizes);
}

}  // namespace gcomp::codec::internal
