#include "format/huffman_code.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp::format {
namespace {

TEST(BuildLengths, SmallCodeIsOptimalAndTieBroken) {
  uint64_t freq[256] = {};
  freq[3] = 1;
  freq[4] = 1;
  freq[5] = 2;
  freq[9] = 4;
  HuffmanWork w;
  uint8_t len[256];
  int single = 0;
  EXPECT_EQ(BuildLengths(freq, 256, w, len, &single), 4);
  EXPECT_EQ(single, -1);
  EXPECT_EQ(len[3], 3);
  EXPECT_EQ(len[4], 3);
  EXPECT_EQ(len[5], 2);
  EXPECT_EQ(len[9], 1);
  EXPECT_EQ(len[0], 0);
}

TEST(BuildLengths, OneSymbolAndNone) {
  uint32_t freq[32] = {};
  HuffmanWork w;
  uint8_t len[256];
  int single = 0;
  EXPECT_EQ(BuildLengths(freq, 32, w, len, &single), 0);
  EXPECT_EQ(single, -1);
  freq[17] = 5;
  EXPECT_EQ(BuildLengths(freq, 32, w, len, &single), 1);
  EXPECT_EQ(single, 17);
  EXPECT_EQ(len[17], 0);
}

// Fibonacci frequencies make the unlimited code 39 deep; the limit halves them until every
// length is at most 11, and the code stays complete (Kraft sum exactly 1).
TEST(BuildLengths, LengthsAreLimitedAndComplete) {
  uint64_t freq[256] = {};
  uint64_t a = 1, b = 1;
  for (int s = 0; s < 40; ++s) {
    freq[s] = a;
    const uint64_t c = a + b;
    a = b;
    b = c;
  }
  HuffmanWork w;
  uint8_t len[256];
  int single = 0;
  ASSERT_EQ(BuildLengths(freq, 256, w, len, &single), 40);
  uint32_t kraft = 0;
  for (int s = 0; s < 40; ++s) {
    ASSERT_GE(len[s], 1);
    ASSERT_LE(len[s], kMaxCodeLen);
    kraft += 1u << (kMaxCodeLen - len[s]);
  }
  EXPECT_EQ(kraft, 1u << kMaxCodeLen);
}

TEST(AssignCodes, CanonicalAndBitReversed) {
  uint8_t len[256] = {};
  len[1] = 2;
  len[2] = 1;
  len[7] = 2;
  uint16_t code[256];
  AssignCodes(len, 8, code);
  // Canonical: symbol 2 -> 0, symbol 1 -> 10, symbol 7 -> 11; stored LSB-first.
  EXPECT_EQ(code[2], 0);
  EXPECT_EQ(code[1], 1);  // "10" reversed
  EXPECT_EQ(code[7], 3);
  EXPECT_EQ(ReverseBits(0b1101, 4), 0b1011);
}

TEST(ParseTable, RoundTripOfTheSerializedForm) {
  // Symbols 4..7 with lengths 2, 2, 2, 2.
  const uint8_t t[] = {4, 3, 0x22, 0x22};
  uint8_t len[256];
  int single = 0, present = 0;
  ASSERT_EQ(ParseTable(t, sizeof(t), 16, len, &single, &present), TableError::kOk);
  EXPECT_EQ(present, 4);
  EXPECT_EQ(single, -1);
  int lo = 0, hi = 0;
  TableRange(len, 16, single, &lo, &hi);
  EXPECT_EQ(lo, 4);
  EXPECT_EQ(hi, 7);
  EXPECT_EQ(TableBytes(lo, hi), sizeof(t));
  std::vector<uint8_t> written;
  EXPECT_EQ(WriteTable(len, lo, hi, [&](uint8_t b) { written.push_back(b); }), sizeof(t));
  EXPECT_EQ(written, std::vector<uint8_t>(t, t + sizeof(t)));
}

TEST(WriteTable, OddSpanPadsTheLastNibbleAndOneSymbolTakesOneByte) {
  uint8_t len[256] = {};
  len[3] = 1;
  len[4] = 2;
  len[5] = 2;
  std::vector<uint8_t> t;
  auto put = [&](uint8_t b) { t.push_back(b); };
  EXPECT_EQ(WriteTable(len, 3, 5, put), 4u);
  EXPECT_EQ(t, (std::vector<uint8_t>{3, 2, 0x21, 0x02}));
  uint8_t parsed[256];
  int single = 0, present = 0;
  EXPECT_EQ(ParseTable(t.data(), t.size(), 16, parsed, &single, &present), TableError::kOk);
  t.clear();
  const uint8_t none[256] = {};
  EXPECT_EQ(WriteTable(none, 9, 9, put), 3u);  // a one-symbol code: length 0
  EXPECT_EQ(t, (std::vector<uint8_t>{9, 0, 0}));
}

TEST(ParseTable, EachBrokenRuleHasItsOwnError) {
  uint8_t len[256];
  int single = 0, present = 0;
  auto parse = [&](std::vector<uint8_t> t, int alphabet) {
    return ParseTable(t.data(), t.size(), alphabet, len, &single, &present);
  };
  EXPECT_EQ(parse({4}, 16), TableError::kTooShort);
  EXPECT_EQ(parse({14, 3, 0x22, 0x22}, 16), TableError::kOutsideAlphabet);
  EXPECT_EQ(parse({4, 3, 0x22}, 16), TableError::kSizeMismatch);
  EXPECT_EQ(parse({4, 3, 0x2C, 0x22}, 16), TableError::kLengthTooLong);
  EXPECT_EQ(parse({4, 2, 0x11, 0x10}, 16), TableError::kBadPadding);
  EXPECT_EQ(parse({4, 3, 0x22, 0x12}, 16), TableError::kIncomplete);
  EXPECT_EQ(parse({4, 1, 0x01}, 16), TableError::kIncomplete);  // one code of length 1
  EXPECT_EQ(parse({9, 0, 0x00}, 16), TableError::kOk);           // one symbol, 0 bits
  EXPECT_EQ(single, 9);
  EXPECT_EQ(present, 1);
}

}  // namespace
}  // namespace gcomp::format
