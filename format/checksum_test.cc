#include "format/checksum.h"

#include <xxhash.h>

#include <cstdint>
#include <random>
#include <vector>

#include "format/block_format.h"
#include "gtest/gtest.h"

namespace gcomp::format {
namespace {

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

// Every length around the stripe (32) and tail (8, 4, 1) boundaries, at an odd address.
TEST(Xxh64, MatchesXxHashLibrary) {
  const std::vector<uint8_t> data = RandomBytes(301, 7);
  for (size_t len = 0; len + 1 <= data.size(); ++len) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x9e3779b97f4a7c15ull}}) {
      ASSERT_EQ(Xxh64(data.data() + 1, len, seed), XXH64(data.data() + 1, len, seed))
          << "len " << len;
    }
  }
}

TEST(Xxh64, LanesThenFinishEqualsSerial) {
  const std::vector<uint8_t> data = RandomBytes(200, 8);
  for (size_t len : {size_t{0}, size_t{31}, size_t{32}, size_t{33}, size_t{100}, size_t{200}}) {
    uint64_t lanes[4] = {};
    if (len >= 32) {
      for (int i = 0; i < 4; ++i) lanes[i] = XxLane(data.data(), len, 5, i);
    }
    EXPECT_EQ(XxFinish(data.data(), len, 5, lanes), Xxh64(data.data(), len, 5)) << len;
  }
}

TEST(BlockChecksum, SeedIsXxh64OfHeaderBeforeChecksumField) {
  std::vector<uint8_t> block = RandomBytes(kHeaderBytes + 40, 9);
  EXPECT_EQ(BlockChecksumSeed(block.data()), XXH64(block.data(), kOffChecksum, 0));
  // The checksum field itself does not feed the seed.
  const uint64_t seed = BlockChecksumSeed(block.data());
  block[kOffChecksum] ^= 0xff;
  EXPECT_EQ(BlockChecksumSeed(block.data()), seed);
}

TEST(BlockChecksum, StoredLittleEndianAtItsOffset) {
  std::vector<uint8_t> block(kHeaderBytes, 0);
  StoreBlockChecksum(block.data(), 0x0102030405060708ull);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(block[kOffChecksum + i], 8 - i) << i;
  EXPECT_EQ(LoadBlockChecksum(block.data()), 0x0102030405060708ull);
  for (uint32_t i = 0; i < kOffChecksum; ++i) EXPECT_EQ(block[i], 0) << i;
}

}  // namespace
}  // namespace gcomp::format
