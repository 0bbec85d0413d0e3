#include "format/block_format.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "format/block_header.h"
#include "format/endian.h"
#include "gtest/gtest.h"

namespace gcomp::format {
namespace {

void Put32(std::vector<uint8_t>& h, uint32_t off, uint32_t v) { StoreLE32(h.data() + off, v); }

// A header (sections not filled in) of an f32 block: 100 elements, 60 nonzeros, inline
// table of 10 bytes, bitmap zero map, streams of 9 bytes each, a 40-byte plane.
std::vector<uint8_t> CodedHeader() {
  std::vector<uint8_t> h(kHeaderBytes, 0);
  Put32(h, kOffMagic, kBlockMagic);
  h[kOffVersion] = kBlockVersion;
  h[kOffDType] = kDTypeF32;
  h[kOffMode] = kModeNearLossless;
  h[kOffRelBits] = 7;
  h[kOffAbsLog2] = static_cast<uint8_t>(int8_t{-16});
  h[kOffZeroMap] = kZeroMapBitmap;
  h[kOffTable] = kTableInline;
  h[kOffEmax] = 130;
  Put32(h, kOffElements, 100);
  Put32(h, kOffNonzeros, 60);
  Put32(h, kOffMantissaBytes, 40);
  Put32(h, kOffZeroMapBytes, 13);
  Put32(h, kOffTableBytes, 10);
  for (int s = 0; s < kNumStreams; ++s) Put32(h, kOffStreamBytes + 4 * s, 9);
  return h;
}
constexpr uint64_t kCodedSize = 56 + 40 + 13 + 10 + 36;

HeaderError Parse(const std::vector<uint8_t>& h, uint64_t size, BlockHeader* b = nullptr) {
  BlockHeader scratch;
  return ParseHeader(h.data(), size, b ? b : &scratch);
}

TEST(ParseHeader, ValidHeaderFillsEveryField) {
  BlockHeader b;
  ASSERT_EQ(Parse(CodedHeader(), kCodedSize, &b), HeaderError::kOk);
  EXPECT_EQ(b.dtype, kDTypeF32);
  EXPECT_EQ(b.abs_log2, -16);
  EXPECT_EQ(b.elements, 100u);
  EXPECT_EQ(b.nonzeros, 60u);
  EXPECT_EQ(b.exponent_bytes, 36u);
  EXPECT_EQ(b.section_bytes, kCodedSize);
}

TEST(ParseHeader, EachBrokenRuleHasItsOwnError) {
  struct Case {
    const char* what;
    void (*edit)(std::vector<uint8_t>&);
    HeaderError want;
  };
  const Case cases[] = {
      {"magic", [](std::vector<uint8_t>& h) { h[0] ^= 1; }, HeaderError::kBadMagic},
      {"version", [](std::vector<uint8_t>& h) { h[kOffVersion] = 2; }, HeaderError::kBadVersion},
      {"dtype", [](std::vector<uint8_t>& h) { h[kOffDType] = 4; }, HeaderError::kBadDType},
      {"mode", [](std::vector<uint8_t>& h) { h[kOffMode] = 2; }, HeaderError::kBadMode},
      {"rel_bits", [](std::vector<uint8_t>& h) { h[kOffRelBits] = 24; }, HeaderError::kBadRelBits},
      {"abs_log2", [](std::vector<uint8_t>& h) { h[kOffAbsLog2] = 1; }, HeaderError::kBadAbsLog2},
      {"zero map", [](std::vector<uint8_t>& h) { h[kOffZeroMap] = 4; },
       HeaderError::kBadZeroMapKind},
      {"table", [](std::vector<uint8_t>& h) { h[kOffTable] = 4; }, HeaderError::kBadTableKind},
      {"emax", [](std::vector<uint8_t>& h) { h[kOffEmax] = 255; }, HeaderError::kBadEmax},
      {"elements", [](std::vector<uint8_t>& h) { Put32(h, kOffElements, kMaxElements + 1); },
       HeaderError::kTooManyElements},
      {"nonzeros", [](std::vector<uint8_t>& h) { Put32(h, kOffNonzeros, 101); },
       HeaderError::kTooManyNonzeros},
      {"size sum", [](std::vector<uint8_t>& h) { Put32(h, kOffTableBytes, 11); },
       HeaderError::kBadSizeSum},
      {"stored", [](std::vector<uint8_t>& h) { h[kOffTable] = kTableStored; },
       HeaderError::kBadStoredSections},
      {"table vs nonzeros", [](std::vector<uint8_t>& h) { h[kOffTable] = kTableNone; },
       HeaderError::kTableVsNonzeros},
      {"inline size",
       [](std::vector<uint8_t>& h) {
         Put32(h, kOffTableBytes, 2);
         Put32(h, kOffMantissaBytes, 48);
       },
       HeaderError::kBadInlineTableSize},
      {"reference size", [](std::vector<uint8_t>& h) { h[kOffTable] = kTableReference; },
       HeaderError::kBadReferenceSize},
      {"zeros without map", [](std::vector<uint8_t>& h) { h[kOffZeroMap] = kZeroMapNone; },
       HeaderError::kZerosWithoutMap},
      {"bitmap size",
       [](std::vector<uint8_t>& h) {
         Put32(h, kOffZeroMapBytes, 12);
         Put32(h, kOffMantissaBytes, 41);
       },
       HeaderError::kBadBitmapSize},
      {"position list",
       [](std::vector<uint8_t>& h) {
         h[kOffZeroMap] = kZeroMapZeroPositions;  // 40 zeros need 40..160 bytes
       },
       HeaderError::kBadPositionListSize},
      {"stream",
       [](std::vector<uint8_t>& h) {  // 15 symbols fit in 21 bytes, not 22
         Put32(h, kOffStreamBytes, 22);
         Put32(h, kOffMantissaBytes, 27);
       },
       HeaderError::kStreamTooLarge},
      {"plane",
       [](std::vector<uint8_t>& h) {  // 60 nonzeros need at least 8 bytes
         Put32(h, kOffMantissaBytes, 7);
         Put32(h, kOffTableBytes, 43);
       },
       HeaderError::kBadPlaneSize},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> h = CodedHeader();
    c.edit(h);
    EXPECT_EQ(Parse(h, kCodedSize), c.want) << c.what;
  }
  EXPECT_EQ(Parse(CodedHeader(), kHeaderBytes - 1), HeaderError::kTooShort);
}

TEST(ParseHeader, StoredAndEmptyBlocks) {
  std::vector<uint8_t> h = CodedHeader();
  h[kOffTable] = kTableStored;
  h[kOffZeroMap] = kZeroMapNone;
  Put32(h, kOffNonzeros, 100);
  Put32(h, kOffMantissaBytes, 400);
  Put32(h, kOffZeroMapBytes, 0);
  Put32(h, kOffTableBytes, 0);
  for (int s = 0; s < kNumStreams; ++s) Put32(h, kOffStreamBytes + 4 * s, 0);
  EXPECT_EQ(Parse(h, 456), HeaderError::kOk);
  h[kOffTable] = kTableNone;  // no nonzeros: only a (bitmap) zero map
  h[kOffZeroMap] = kZeroMapBitmap;
  Put32(h, kOffNonzeros, 0);
  Put32(h, kOffMantissaBytes, 0);
  Put32(h, kOffZeroMapBytes, 13);
  EXPECT_EQ(Parse(h, 69), HeaderError::kOk);
  Put32(h, kOffMantissaBytes, 1);
  Put32(h, kOffZeroMapBytes, 12);
  EXPECT_EQ(Parse(h, 69), HeaderError::kBadEmptySections);
}

TEST(WriteHeader, WritesWhatParseHeaderReads) {
  BlockHeader b;
  ASSERT_EQ(Parse(CodedHeader(), kCodedSize, &b), HeaderError::kOk);
  std::vector<uint8_t> h(kHeaderBytes, 0xee);
  WriteHeader(b, h.data());
  const std::vector<uint8_t> want = CodedHeader();
  EXPECT_TRUE(std::equal(h.begin(), h.begin() + kOffChecksum, want.begin()));
  for (uint32_t i = kOffChecksum; i < kHeaderBytes; ++i) EXPECT_EQ(h[i], 0xee) << i;
}

TEST(WriteHeader, StoredHeaderKeepsPolicyAndEmax) {
  BlockHeader b;
  ASSERT_EQ(Parse(CodedHeader(), kCodedSize, &b), HeaderError::kOk);
  const BlockHeader r = StoredHeader(b);
  std::vector<uint8_t> h(kHeaderBytes, 0);
  WriteHeader(r, h.data());
  BlockHeader back;
  ASSERT_EQ(Parse(h, kHeaderBytes + 400, &back), HeaderError::kOk);
  EXPECT_EQ(back.table, kTableStored);
  EXPECT_EQ(back.zero_map, kZeroMapNone);
  EXPECT_EQ(back.nonzeros, 100u);
  EXPECT_EQ(back.mantissa_bytes, 400u);
  EXPECT_EQ(back.exponent_bytes, 0u);
  EXPECT_EQ(r.section_bytes, back.section_bytes);
  EXPECT_EQ(back.abs_log2, -16);
  EXPECT_EQ(back.rel_bits, 7);
  EXPECT_EQ(back.emax, 130);
}

TEST(BlockFormat, MantissaWidths) {
  const FloatBits f32 = FloatBitsOfCode(kDTypeF32);
  EXPECT_EQ(MantissaWidth(f32, kModeLossless, 7, -16, 130, 120), 23);
  EXPECT_EQ(MantissaWidth(f32, kModeNearLossless, 7, -16, 130, 130), 7);   // relative bound
  EXPECT_EQ(MantissaWidth(f32, kModeNearLossless, 7, -16, 130, 120), 5);   // absolute floor
  EXPECT_EQ(MantissaWidth(f32, kModeNearLossless, 7, -16, 130, 110), 0);
  EXPECT_EQ(MantissaWidth(f32, kModeNearLossless, 7, -16, 130, 0), 23);    // subnormal
  EXPECT_EQ(MantissaWidth(f32, kModeNearLossless, 7, -16, 254, 254), 23);  // largest finite
  const FloatBits bf16 = FloatBitsOfCode(kDTypeBF16);
  EXPECT_EQ(MantissaWidth(bf16, kModeNearLossless, 20, -1, 100, 100), 0);
  EXPECT_EQ(MantissaWidth(bf16, kModeNearLossless, 20, -30, 100, 100), 7);  // dtype's width
  EXPECT_EQ(FloatBitsOfCode(kDTypeF16).all_ones(), 31);
}

TEST(BlockFormat, StreamsAndVarints) {
  EXPECT_EQ(StreamCount<uint32_t>(10, 0), 3u);
  EXPECT_EQ(StreamCount<uint32_t>(10, 1), 3u);
  EXPECT_EQ(StreamCount<uint32_t>(10, 2), 2u);
  EXPECT_EQ(StreamStart<uint32_t>(10, 3), 8u);
  EXPECT_EQ(StreamStart<size_t>(7, 3), 6u);
  EXPECT_EQ(MaxStreamBytesFor(8), 11u);
  EXPECT_EQ(VarintBytes(0), 1u);
  EXPECT_EQ(VarintBytes(127), 1u);
  EXPECT_EQ(VarintBytes(128), 2u);
  EXPECT_EQ(VarintBytes(uint32_t{1} << 28), 5u);
}

}  // namespace
}  // namespace gcomp::format
