#include "format/endian.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp::format {
namespace {

TEST(Endian, StoresLeastSignificantByteFirst) {
  uint8_t b[8];
  StoreLE16(b, 0x0102);
  EXPECT_EQ(b[0], 0x02);
  EXPECT_EQ(b[1], 0x01);
  StoreLE32(b, 0x01020304u);
  EXPECT_EQ(std::vector<uint8_t>(b, b + 4), (std::vector<uint8_t>{4, 3, 2, 1}));
  StoreLE64(b, 0x0102030405060708ull);
  EXPECT_EQ(std::vector<uint8_t>(b, b + 8), (std::vector<uint8_t>{8, 7, 6, 5, 4, 3, 2, 1}));
}

TEST(Endian, LoadsLeastSignificantByteFirst) {
  const uint8_t b[8] = {0xf8, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x81};
  EXPECT_EQ(LoadLE16(b), 0x07f8);
  EXPECT_EQ(LoadLE32(b), 0x050607f8u);
  EXPECT_EQ(LoadLE64(b), 0x81020304050607f8ull);
}

// Powers of two and their neighbours, at every alignment within a word.
TEST(Endian, RoundTripsEdgeValuesAtAnyAlignment) {
  std::vector<uint64_t> values = {0, ~uint64_t{0}};
  for (int s = 0; s < 64; ++s) {
    const uint64_t p = uint64_t{1} << s;
    values.insert(values.end(), {p - 1, p, p + 1});
  }
  uint8_t buf[24] = {};
  for (int off = 0; off < 8; ++off) {
    for (uint64_t v : values) {
      StoreLE64(buf + off, v);
      EXPECT_EQ(LoadLE64(buf + off), v) << off;
      StoreLE32(buf + off, static_cast<uint32_t>(v));
      EXPECT_EQ(LoadLE32(buf + off), static_cast<uint32_t>(v)) << off;
      StoreLE16(buf + off, static_cast<uint16_t>(v));
      EXPECT_EQ(LoadLE16(buf + off), static_cast<uint16_t>(v)) << off;
    }
  }
}

TEST(Endian, StoresTouchOnlyTheirBytes) {
  uint8_t buf[12];
  for (uint8_t& c : buf) c = 0xaa;
  StoreLE32(buf + 2, 0);
  StoreLE64(buf + 4, 0);
  EXPECT_EQ(buf[0], 0xaa);
  EXPECT_EQ(buf[1], 0xaa);
  for (int i = 2; i < 12; ++i) EXPECT_EQ(buf[i], 0) << i;
  StoreLE16(buf + 10, 0xffff);
  EXPECT_EQ(buf[9], 0);
}

TEST(Endian, PrefixLoadReadsOnlyItsBytes) {
  const uint8_t buf[8] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
  EXPECT_EQ(LoadLE64Prefix(buf, 0), 0u);
  EXPECT_EQ(LoadLE64Prefix(buf, 3), 0x030201u);
  EXPECT_EQ(LoadLE64Prefix(buf, 8), LoadLE64(buf));
}

}  // namespace
}  // namespace gcomp::format
