// Decoding damaged input: every truncation, bit flips and forged headers return an error.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <xxhash.h>

#include "codec/codec.h"
#include "codec/testing/values.h"
#include "format/checksum.h"
#include "format/endian.h"
#include "gtest/gtest.h"

namespace gcomp::codec {
namespace {

using testing::MakeValues;
using testing::Pattern;

struct Case {
  DType dtype;
  Mode mode;
  Pattern pattern;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (Mode m : {Mode::kLossless, Mode::kNearLossless}) {
      for (Pattern p : {Pattern::kGradientLike, Pattern::kSpecials}) cases.push_back({d, m, p});
    }
  }
  return cases;
}

std::string EncodeCase(const Case& c, size_t n, std::vector<uint8_t>* in) {
  *in = MakeValues(c.dtype, c.pattern, n, 77);
  Policy policy;
  policy.mode = c.mode;
  std::string block;
  EXPECT_TRUE(EncodeBlock(c.dtype, in->data(), n, policy, &block).ok());
  return block;
}

TEST(Corruption, EveryTruncationFails) {
  for (const Case& c : Cases()) {
    std::vector<uint8_t> in;
    const size_t n = 300;
    const std::string block = EncodeCase(c, n, &in);
    std::vector<uint8_t> out(n * DTypeBytes(c.dtype));
    for (size_t len = 0; len < block.size(); ++len) {
      // A fresh copy of exactly len bytes, so reading past it is caught by the sanitizers.
      std::vector<uint8_t> cut(block.begin(), block.begin() + len);
      EXPECT_FALSE(DecodeBlock(absl::MakeConstSpan(cut), c.dtype, out.data(), n).ok()) << len;
      EXPECT_FALSE(InspectBlock(absl::MakeConstSpan(cut)).ok());
    }
  }
}

TEST(Corruption, EverySingleBitFlipFails) {
  for (const Case& c : Cases()) {
    std::vector<uint8_t> in;
    const size_t n = 200;
    const std::string block = EncodeCase(c, n, &in);
    std::vector<uint8_t> out(n * DTypeBytes(c.dtype));
    std::vector<uint8_t> bad(block.begin(), block.end());
    for (size_t bit = 0; bit < 8 * bad.size(); ++bit) {
      bad[bit / 8] ^= 1 << (bit % 8);
      EXPECT_FALSE(DecodeBlock(absl::MakeConstSpan(bad), c.dtype, out.data(), n).ok()) << bit;
      bad[bit / 8] ^= 1 << (bit % 8);
    }
  }
}

// The checksum is the only check a flip in a mantissa byte meets: InspectBlock catches it,
// InspectBlockSkippingChecksum (for callers that decode next) and DecodeBlock without
// verify_checksum let it through, and still refuse a damaged header.
TEST(Corruption, InspectingWithoutTheChecksumSkipsOnlyTheChecksum) {
  for (const Case& c : Cases()) {
    std::vector<uint8_t> in;
    const size_t n = 200;
    const std::string block = EncodeCase(c, n, &in);
    absl::StatusOr<BlockInfo> good = InspectBlock(AsBytes(block));
    ASSERT_TRUE(good.ok());
    std::vector<uint8_t> bad(block.begin(), block.end());
    bad[kBlockHeaderBytes] ^= 0x10;  // the first byte of the sign + mantissa plane
    const absl::Status checked = InspectBlock(absl::MakeConstSpan(bad)).status();
    EXPECT_EQ(checked.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(checked.message(), "block checksum mismatch");
    absl::StatusOr<BlockInfo> skipped = InspectBlockSkippingChecksum(absl::MakeConstSpan(bad));
    ASSERT_TRUE(skipped.ok()) << skipped.status();
    EXPECT_EQ(skipped->nonzeros, good->nonzeros);
    EXPECT_EQ(skipped->mantissa_bytes, good->mantissa_bytes);
    EXPECT_EQ(skipped->exponent_bytes, good->exponent_bytes);
    std::vector<uint8_t> out(n * DTypeBytes(c.dtype));
    EXPECT_EQ(DecodeBlock(absl::MakeConstSpan(bad), c.dtype, out.data(), n).code(),
              absl::StatusCode::kDataLoss);
    // A caller that verified its own checksum over these bytes decodes without this one.
    BlockDecodeOptions unchecked;
    unchecked.verify_checksum = false;
    EXPECT_TRUE(DecodeBlock(absl::MakeConstSpan(bad), c.dtype, out.data(), n, unchecked).ok());
    bad[0] ^= 1;  // the magic
    EXPECT_FALSE(DecodeBlock(absl::MakeConstSpan(bad), c.dtype, out.data(), n, unchecked).ok());
    EXPECT_FALSE(InspectBlockSkippingChecksum(absl::MakeConstSpan(bad)).ok());
  }
}

TEST(Corruption, RandomDamageNeverCrashes) {
  std::mt19937 rng(5);
  for (const Case& c : Cases()) {
    std::vector<uint8_t> in;
    const size_t n = 5000;
    const std::string block = EncodeCase(c, n, &in);
    std::vector<uint8_t> out(n * DTypeBytes(c.dtype));
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<uint8_t> bad(block.begin(), block.end());
      const int flips = 1 + rng() % 8;
      for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] ^= 1 + rng() % 255;
      EXPECT_FALSE(DecodeBlock(absl::MakeConstSpan(bad), c.dtype, out.data(), n).ok());
    }
  }
}

// Damage with a recomputed checksum reaches the structural checks behind it.
void Reseal(std::vector<uint8_t>* b) {
  uint8_t* const p = b->data();
  const size_t header = kBlockHeaderBytes;
  format::StoreBlockChecksum(
      p, XXH64(p + header, b->size() - header, format::BlockChecksumSeed(p)));
}

TEST(Corruption, ResealedDamageFailsOrStaysInBounds) {
  std::mt19937 rng(11);
  for (const Case& c : Cases()) {
    std::vector<uint8_t> in;
    const size_t n = 3000;
    const std::string block = EncodeCase(c, n, &in);
    std::vector<uint8_t> out(n * DTypeBytes(c.dtype));
    for (int trial = 0; trial < 500; ++trial) {
      std::vector<uint8_t> bad(block.begin(), block.end());
      bad[56 + rng() % (bad.size() - 56)] ^= 1 << (rng() % 8);
      if (trial % 5 == 0) bad[rng() % 48] ^= 1 << (rng() % 8);
      Reseal(&bad);
      // Payload damage may decode to other values; it must never crash or overrun.
      (void)DecodeBlock(absl::MakeConstSpan(bad), c.dtype, out.data(), n);
    }
  }
}

TEST(Corruption, ForgedHugeCountsFailWithoutAllocating) {
  std::vector<uint8_t> in;
  const std::string block = EncodeCase({DType::kF32, Mode::kLossless, Pattern::kGradientLike},
                                       100, &in);
  for (uint32_t count : {0xffffffffu, (1u << 26) + 1, 1u << 26, 1u << 20}) {
    for (int field : {12, 16}) {  // element count, nonzero count
      std::vector<uint8_t> bad(block.begin(), block.end());
      format::StoreLE32(bad.data() + field, count);
      Reseal(&bad);
      float out[100];
      EXPECT_FALSE(DecodeBlock(absl::MakeConstSpan(bad), DType::kF32, out, 100).ok());
      EXPECT_FALSE(InspectBlock(absl::MakeConstSpan(bad)).ok()) << field << " " << count;
    }
  }
}

TEST(Corruption, FrameTruncationsAndFlipsFail) {
  const std::vector<uint8_t> in = MakeValues(DType::kF32, Pattern::kGradientLike, 3000, 1);
  BufferOptions options;
  options.block_bytes = 4000;
  std::string frame;
  ASSERT_TRUE(EncodeBuffer(DType::kF32, in.data(), 3000, options, &frame).ok());
  std::vector<float> out(3000);
  for (size_t len = 0; len < frame.size(); len += 7) {
    std::vector<uint8_t> cut(frame.begin(), frame.begin() + len);
    EXPECT_FALSE(DecodeBuffer(absl::MakeConstSpan(cut), DType::kF32, out.data(), 3000, 2).ok());
  }
  std::vector<uint8_t> bad(frame.begin(), frame.end());
  for (size_t bit = 0; bit < 8 * bad.size(); bit += 13) {
    bad[bit / 8] ^= 1 << (bit % 8);
    EXPECT_FALSE(DecodeBuffer(absl::MakeConstSpan(bad), DType::kF32, out.data(), 3000, 1).ok());
    bad[bit / 8] ^= 1 << (bit % 8);
  }
}

TEST(Corruption, AFrameOfNearly2To64ElementsAndNoBlocksIsRejected) {
  // elements + B - 1 wrapped to a block count of 0: such a frame passed with no blocks.
  std::string frame;
  ASSERT_TRUE(EncodeBuffer(DType::kF32, nullptr, 0, BufferOptions{}, &frame).ok());
  std::vector<uint8_t> forged(frame.begin(), frame.begin() + 24);
  format::StoreLE64(forged.data() + 8, ~uint64_t{0});  // elements
  format::StoreLE32(forged.data() + 16, 2);            // elements per block
  format::StoreLE32(forged.data() + 20, 0);            // block count
  forged.resize(32);
  format::StoreLE64(forged.data() + 24, XXH64(forged.data(), 24, 0));
  absl::StatusOr<FrameInfo> info = InspectFrame(absl::MakeConstSpan(forged));
  ASSERT_FALSE(info.ok());
  EXPECT_EQ(info.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(info.status().message().find("block count"), std::string::npos) << info.status();
}

TEST(Corruption, GarbageIsRejected) {
  std::mt19937 rng(3);
  std::vector<float> out(1000);
  for (int trial = 0; trial < 1000; ++trial) {
    std::vector<uint8_t> junk(rng() % 300);
    for (uint8_t& b : junk) b = rng();
    if (junk.size() >= 4 && trial % 2) format::StoreLE32(junk.data(), 0x31424347);
    EXPECT_FALSE(DecodeBlock(absl::MakeConstSpan(junk), DType::kF32, out.data(), 1000).ok());
    EXPECT_FALSE(DecodeBuffer(absl::MakeConstSpan(junk), DType::kF32, out.data(), 1000, 1).ok());
  }
}

}  // namespace
}  // namespace gcomp::codec
