#include "cluster/wire_block.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp::cluster {
namespace {

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.1f * i) * 1e-3f;
  return v;
}

TEST(WireBlock, RawRoundTripIsExact) {
  std::vector<float> in = Ramp(100), out(100);
  proto::CompressedBlock b;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, in.data(), 100, &b).ok());
  EXPECT_EQ(b.codec(), proto::CODEC_RAW);
  ASSERT_TRUE(DecodeWireBlock(b, codec::DType::kF32, 100, out.data()).ok());
  EXPECT_EQ(in, out);
}

TEST(WireBlock, LosslessRoundTripIsExact) {
  std::vector<float> in = Ramp(1000), out(1000);
  proto::CompressedBlock b;
  codec::Policy p;
  p.mode = codec::Mode::kLossless;
  ASSERT_TRUE(EncodeWireBlock({false, p}, codec::DType::kF32, in.data(), 1000, &b).ok());
  EXPECT_EQ(b.codec(), proto::CODEC_GCOMP);
  ASSERT_TRUE(DecodeWireBlock(b, codec::DType::kF32, 1000, out.data()).ok());
  EXPECT_EQ(0, std::memcmp(in.data(), out.data(), 4000));
}

TEST(WireBlock, CorruptionIsDataLoss) {
  std::vector<float> in = Ramp(100), out(100);
  proto::CompressedBlock b;
  ASSERT_TRUE(EncodeWireBlock({false, {}}, codec::DType::kF32, in.data(), 100, &b).ok());
  (*b.mutable_data())[b.data().size() / 2] ^= 0x40;
  EXPECT_EQ(DecodeWireBlock(b, codec::DType::kF32, 100, out.data()).code(),
            absl::StatusCode::kDataLoss);
  // Consistent checksum over corrupt codec bytes: the codec itself must catch it.
  b.set_data(std::string(b.data().size(), '\x5a'));
  b.set_checksum(0);
  EXPECT_EQ(DecodeWireBlock(b, codec::DType::kF32, 100, out.data()).code(),
            absl::StatusCode::kDataLoss);
}

TEST(WireBlock, WrongDtypeOrSizeIsInvalidArgument) {
  std::vector<float> in = Ramp(10), out(10);
  proto::CompressedBlock b;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, in.data(), 10, &b).ok());
  EXPECT_EQ(DecodeWireBlock(b, codec::DType::kBF16, 10, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeWireBlock(b, codec::DType::kF32, 9, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// A raw block of 8 bytes claiming 2^62 + 2 f32 elements: (2^62 + 2) * 4 wraps to 8.
TEST(WireBlock, RawElementCountThatOverflowsIsRefused) {
  std::vector<float> in = Ramp(2);
  proto::CompressedBlock b;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, in.data(), 2, &b).ok());
  const size_t huge = (size_t{1} << 62) + 2;
  b.set_elements(huge);
  EXPECT_EQ(CheckWireBlock(b, codec::DType::kF32, huge).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcomp::cluster
