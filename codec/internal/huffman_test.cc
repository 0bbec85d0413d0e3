#include "codec/internal/huffman.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace gcomp::codec::internal {
namespace {

uint32_t Kraft(const HuffmanCode& code) {
  uint32_t k = 0;
  for (int s = 0; s < code.alphabet; ++s) {
    if (code.len[s]) k += 1u << (kMaxCodeLen - code.len[s]);
  }
  return k;
}

TEST(Huffman, FibonacciFrequenciesAreCappedAtElevenBits) {
  uint64_t freq[256] = {};
  uint64_t a = 1, b = 1;
  for (int s = 0; s < 40; ++s) {
    freq[s] = a;
    uint64_t c = a + b;
    a = b;
    b = c;
  }
  HuffmanCode code;
  BuildLengths(freq, 256, &code);
  for (int s = 0; s < 40; ++s) {
    EXPECT_GE(code.len[s], 1);
    EXPECT_LE(code.len[s], kMaxCodeLen);
  }
  EXPECT_EQ(Kraft(code), 1u << kMaxCodeLen);
}

TEST(Huffman, SerializeParseRoundTripAndStreams) {
  std::mt19937 rng(2);
  for (int alphabet : {32, 256}) {
    for (int trial = 0; trial < 50; ++trial) {
      // Both sides of the decoder's multi-symbol table (built from 16384 symbols on).
      const size_t n = rng() % 40000;
      std::vector<uint8_t> syms(n + 8);
      uint64_t freq[256] = {};
      const int spread = 1 + rng() % alphabet;
      const int base = rng() % (alphabet - spread + 1);
      for (size_t i = 0; i < n; ++i) {
        syms[i] =
            static_cast<uint8_t>(base + std::min<int>(spread - 1, __builtin_ctz(rng() | 1u << 30)));
        ++freq[syms[i]];
      }
      HuffmanCode code;
      BuildLengths(freq, alphabet, &code);
      AssignCodes(&code);
      if (n == 0) continue;
      std::string table;
      SerializeTable(code, &table);
      HuffmanCode parsed;
      ASSERT_TRUE(ParseTable(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(table.data()),
                                                 table.size()),
                             alphabet, &parsed)
                      .ok());
      ASSERT_EQ(0, std::memcmp(parsed.len, code.len, sizeof(code.len)));
      std::vector<uint8_t> buf(MaxStreamBytes(n) + 8);
      uint32_t sizes[4];
      EncodeStreams(syms.data(), n, code, buf.data(), sizes);
      absl::Span<const uint8_t> streams[4];
      size_t off = 0;
      for (int s = 0; s < 4; ++s) {
        streams[s] = absl::MakeConstSpan(buf.data() + off, sizes[s]);
        off += sizes[s];
      }
      uint16_t dec[kDecodeTableSize];
      BuildDecodeTable(parsed, dec);
      std::vector<uint8_t> out(n);
      ASSERT_TRUE(DecodeStreams(streams, dec, n, out.data()).ok());
      ASSERT_EQ(0, std::memcmp(out.data(), syms.data(), n));
    }
  }
}

// Codes syms[0, n) with the code built from `freq`, by the scalar path and by each vector
// level this CPU has: the same stream sizes and bytes. `where` names the case in failures.
void ExpectVectorStreamsEqualScalar(const std::vector<uint8_t>& syms, size_t n,
                                    const uint64_t* freq, const std::string& where) {
  HuffmanCode code;
  BuildLengths(freq, 256, &code);
  AssignCodes(&code);
  std::vector<uint8_t> fast(MaxStreamBytes(n) + 8), slow(MaxStreamBytes(n) + 8);
  uint32_t fast_sizes[4], slow_sizes[4];
  EncodeStreamsScalar(syms.data(), n, code, slow.data(), slow_sizes);
  for (VectorLevel level : {VectorLevel::kAvx2, VectorLevel::kAvx512}) {
    if (level > MaxVectorLevel()) continue;
    const std::string name =
        absl::StrCat(level == VectorLevel::kAvx2 ? "AVX2 " : "AVX-512 ", where);
    EncodeStreamsAt(level, syms.data(), n, code, fast.data(), fast_sizes);
    size_t total = 0;
    for (int s = 0; s < 4; ++s) {
      ASSERT_EQ(fast_sizes[s], slow_sizes[s]) << name;
      total += slow_sizes[s];
    }
    ASSERT_EQ(0, std::memcmp(fast.data(), slow.data(), total)) << name;
  }
}

// The vector path (symbol spans up to 64, when the CPU has AVX2) writes the same bytes as
// the scalar one, for every span, length and stream tail.
TEST(Huffman, VectorStreamsEqualScalarStreams) {
  if (MaxVectorLevel() < VectorLevel::kAvx2)
    GTEST_SKIP() << "this CPU has no AVX2: only the scalar path runs";
  std::mt19937 rng(5);
  for (int spread : {1, 2, 5, 16, 17, 31, 32, 33, 48, 63, 64, 65, 127, 128, 129, 200}) {
    for (size_t n : {size_t{127}, size_t{128}, size_t{129}, size_t{255}, size_t{256}, size_t{257},
                     size_t{1000}, size_t{4099}, size_t{65536}}) {
      const int base = static_cast<int>(rng() % (257 - spread));
      std::vector<uint8_t> syms(n + 32);
      uint64_t freq[256] = {};
      for (size_t i = 0; i < n; ++i) {
        // Skewed, so that code lengths run from 1 to the 11-bit cap.
        const int d = std::min<int>(spread - 1,
                                    __builtin_ctz(rng() | 1u << 30) + static_cast<int>(rng() % 3));
        syms[i] = static_cast<uint8_t>(base + d);
        ++freq[syms[i]];
      }
      ExpectVectorStreamsEqualScalar(syms, n, freq, absl::StrCat("spread ", spread, " n ", n));
      if (HasFatalFailure()) return;
    }
  }
}

// Long codes in a row: the vector paths' fallbacks for runs of codes too long for one put.
TEST(Huffman, VectorStreamsEqualScalarStreamsOnLongCodes) {
  std::mt19937 rng(11);
  for (int spread : {20, 64, 100, 128}) {
    uint64_t freq[256] = {};
    // A geometric head, so that the rest of the symbols get codes at the 11-bit cap.
    for (int s = 0; s < spread; ++s) freq[40 + s] = s < 12 ? uint64_t{1} << (40 - 2 * s) : 1;
    const size_t n = 20000;
    std::vector<uint8_t> syms(n + 32);
    for (size_t i = 0; i < n; ++i) {
      syms[i] = static_cast<uint8_t>(40 + (rng() % 8 == 0 ? 0 : 1 + rng() % (spread - 1)));
    }
    ExpectVectorStreamsEqualScalar(syms, n, freq, absl::StrCat("spread ", spread));
    if (HasFatalFailure()) return;
  }
}

// Symbols in clusters far apart (finite exponents and the Inf/NaN symbol 255, or clusters a
// window's width apart): the vector paths cover them with windows, or fall back where too
// many windows would be needed, and write the same bytes as the scalar path.
TEST(Huffman, VectorStreamsEqualScalarStreamsForSymbolClusters) {
  std::mt19937 rng(13);
  struct Case {
    std::vector<int> starts;  // each cluster's first symbol
    int width;                // symbols per cluster
  };
  const std::vector<Case> cases = {{{100, 255}, 18},
                                   {{0, 255}, 1},
                                   {{110, 254}, 2},
                                   {{10, 100, 200}, 16},
                                   {{10, 100, 200}, 17},
                                   {{0, 64, 128, 192}, 16},
                                   {{0, 64, 128, 192, 240}, 8},
                                   {{60, 124}, 64},
                                   {{60, 125}, 64},
                                   {{200, 255}, 1}};
  for (const Case& c : cases) {
    std::vector<int> alphabet;
    for (int start : c.starts) {
      for (int d = 0; d < c.width && start + d < 256; ++d) alphabet.push_back(start + d);
    }
    for (size_t n : {size_t{128}, size_t{1000}, size_t{65536}}) {
      std::vector<uint8_t> syms(n + 32);
      uint64_t freq[256] = {};
      for (size_t i = 0; i < n; ++i) {
        // Skewed towards the first symbols, so code lengths vary.
        const size_t pick = std::min<size_t>(
            alphabet.size() - 1, __builtin_ctz(rng() | 1u << 30) + rng() % alphabet.size() / 4);
        syms[i] = static_cast<uint8_t>(alphabet[pick]);
        ++freq[syms[i]];
      }
      ExpectVectorStreamsEqualScalar(
          syms, n, freq,
          absl::StrCat("clusters from ", c.starts[0], " of ", c.width, " (", c.starts.size(),
                       ") n ", n));
      if (HasFatalFailure()) return;
      uint64_t counted[256];
      CountSymbols(syms.data(), n, counted);
      for (int s = 0; s < 256; ++s) ASSERT_EQ(counted[s], freq[s]) << "symbol " << s;
    }
  }
}

TEST(Huffman, CoverSymbolsTakesTheFewestWindows) {
  HuffmanCode code;
  uint64_t freq[256] = {};
  for (int s : {100, 101, 115, 116, 131, 255}) freq[s] = 1 + s % 3;
  BuildLengths(freq, 256, &code);
  AssignCodes(&code);
  const SymbolWindows w16 = CoverSymbols(code, 16, 4);
  ASSERT_EQ(w16.count, 3);
  EXPECT_EQ(w16.base[0], 100);
  EXPECT_EQ(w16.base[1], 116);
  EXPECT_EQ(w16.base[2], 255);
  EXPECT_EQ(CoverSymbols(code, 16, 2).count, 0);  // needs three
  const SymbolWindows w64 = CoverSymbols(code, 64, 2);
  ASSERT_EQ(w64.count, 2);
  EXPECT_EQ(w64.base[0], 100);
  EXPECT_EQ(w64.base[1], 255);
}

TEST(Huffman, VectorCountsEqualScalarCounts) {
  std::mt19937 rng(9);
  for (int spread : {1, 2, 7, 8, 9, 17, 23, 24, 25, 256}) {
    for (size_t n : {size_t{0}, size_t{31}, size_t{32}, size_t{33}, size_t{255 * 32},
                     size_t{255 * 32 + 1}, size_t{300000}}) {
      const int base = static_cast<int>(rng() % (257 - spread));
      std::vector<uint8_t> syms(n);
      for (uint8_t& s : syms) s = static_cast<uint8_t>(base + rng() % spread);
      // One symbol so frequent that a byte counter would wrap if it were not emptied.
      for (size_t i = 0; i < n; i += 2) syms[i] = static_cast<uint8_t>(base);
      uint64_t fast[256], slow[256];
      CountSymbols(syms.data(), n, fast);
      CountSymbolsScalar(syms.data(), n, slow);
      uint64_t total = 0;
      for (int s = 0; s < 256; ++s) {
        ASSERT_EQ(fast[s], slow[s]) << "spread " << spread << " n " << n << " symbol " << s;
        total += slow[s];
      }
      ASSERT_EQ(total, n);
    }
  }
}

TEST(Huffman, ParseRejectsBadTables) {
  const uint8_t incomplete[] = {0, 2, 0x11, 0x02};  // lengths 1,1,2: over-full
  HuffmanCode code;
  EXPECT_FALSE(ParseTable(absl::MakeConstSpan(incomplete), 256, &code).ok());
  const uint8_t too_long[] = {0, 1, 0xcc};
  EXPECT_FALSE(ParseTable(absl::MakeConstSpan(too_long), 256, &code).ok());
  const uint8_t out_of_alphabet[] = {31, 1, 0x11};
  EXPECT_FALSE(ParseTable(absl::MakeConstSpan(out_of_alphabet), 32, &code).ok());
  const uint8_t single[] = {7, 0, 0x00};
  ASSERT_TRUE(ParseTable(absl::MakeConstSpan(single), 32, &code).ok());
  EXPECT_EQ(code.single_symbol, 7);
}

TEST(Huffman, OneSymbolCodesDecodeWithoutReadingAndRefuseStrayBytes) {
  HuffmanCode code;
  const uint8_t single[] = {7, 0, 0x00};
  ASSERT_TRUE(ParseTable(absl::MakeConstSpan(single), 32, &code).ok());
  uint16_t dec[kDecodeTableSize];
  BuildDecodeTable(code, dec);
  for (size_t n : {size_t{0}, size_t{5}, size_t{100000}}) {
    absl::Span<const uint8_t> streams[4];
    std::vector<uint8_t> out(n + 1, 0xee);
    ASSERT_TRUE(DecodeStreams(streams, dec, n, out.data()).ok());
    EXPECT_EQ(std::count(out.begin(), out.end() - 1, 7), static_cast<ptrdiff_t>(n));
    EXPECT_EQ(out[n], 0xee);  // nothing past n
  }
  const uint8_t stray[1] = {0};
  absl::Span<const uint8_t> streams[4] = {{}, {}, absl::MakeConstSpan(stray), {}};
  std::vector<uint8_t> out(10);
  const absl::Status st = DecodeStreams(streams, dec, 10, out.data());
  EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(st.message().find("exponent stream 2"), absl::string_view::npos) << st;
}

}  // namespace
}  // namespace gcomp::codec::internal
