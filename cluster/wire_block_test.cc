#include "cluster/wire_block.h"

#include <cmath>
#include <cstring>
#include <string>
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
  // A consistent wire checksum over a damaged codec block. The wire checksum is what a
  // decode trusts (it covers the same bytes, and one pass fewer is about 6% of a decode), so
  // DecodeWireBlock reads the flipped plane bit as data; CheckWireBlock, which decodes
  // nothing, still verifies the block's own checksum too.
  ASSERT_TRUE(EncodeWireBlock({false, {}}, codec::DType::kF32, in.data(), 100, &b).ok());
  (*b.mutable_data())[codec::kBlockHeaderBytes] ^= 0x10;
  {
    const absl::string_view data = b.data();
    b.set_checksum(*WireChecksum(b.checksum_kind(), WirePieces(&data, 1)));
  }
  std::vector<float> undamaged(100);
  {
    proto::CompressedBlock good;
    ASSERT_TRUE(EncodeWireBlock({false, {}}, codec::DType::kF32, in.data(), 100, &good).ok());
    ASSERT_TRUE(DecodeWireBlock(good, codec::DType::kF32, 100, undamaged.data()).ok());
  }
  EXPECT_TRUE(DecodeWireBlock(b, codec::DType::kF32, 100, out.data()).ok());
  EXPECT_NE(0, std::memcmp(undamaged.data(), out.data(), 400)) << "the flip reached no element";
  const absl::Status checked = CheckWireBlock(b, codec::DType::kF32, 100);
  EXPECT_EQ(checked.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(checked.message(), "corrupt codec block: block checksum mismatch");
  // Consistent checksum over corrupt codec bytes: the codec itself must catch it.
  b.set_data(std::string(b.data().size(), '\x5a'));
  const absl::string_view data = b.data();
  b.set_checksum(*WireChecksum(b.checksum_kind(), WirePieces(&data, 1)));
  EXPECT_EQ(DecodeWireBlock(b, codec::DType::kF32, 100, out.data()).code(),
            absl::StatusCode::kDataLoss);
}

// Bytes encoded elsewhere (the GPU codec, copied to host memory) are sealed with a wire
// checksum only after their own checksum holds: damage in the copy never gets a valid seal.
TEST(WireBlock, FillChecksBytesEncodedElsewhere) {
  std::vector<float> in = Ramp(100);
  std::string bytes;
  ASSERT_TRUE(codec::EncodeBlock(codec::DType::kF32, in.data(), 100, codec::Policy{}, &bytes).ok());
  proto::CompressedBlock b;
  ASSERT_TRUE(FillWireBlock({false, {}}, codec::DType::kF32, 100, bytes, &b).ok());
  std::vector<float> out(100);
  ASSERT_TRUE(DecodeWireBlock(b, codec::DType::kF32, 100, out.data()).ok());
  bytes[codec::kBlockHeaderBytes] ^= 0x10;
  const absl::Status s = FillWireBlock({false, {}}, codec::DType::kF32, 100, bytes, &b);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(s.message(), "encoded block unreadable: block checksum mismatch");
}

TEST(WireBlock, WrongDtypeOrSizeIsInvalidArgument) {
  std::vector<float> in = Ramp(10), out(10);
  proto::CompressedBlock b;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, in.data(), 10, &b).ok());
  EXPECT_EQ(DecodeWireBlock(b, codec::DType::kBF16, 10, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeWireBlock(b, codec::DType::kF32, 9, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  // A dtype number this build does not know is named by its value.
  b.set_dtype(static_cast<proto::DType>(77));
  const absl::Status unknown = DecodeWireBlock(b, codec::DType::kF32, 10, out.data());
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.message(), "block dtype unknown value 77 does not match tensor dtype f32");
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

// XXH64 of `s`, seed 0, as xxhash's reference implementation computes it for "abc".
TEST(WireChecksum, KindsAreTheReferenceHashesInOnePieceOrMany) {
  const absl::string_view abc = "abc";
  EXPECT_EQ(*WireChecksum(proto::CHECKSUM_XXH64, WirePieces(&abc, 1)), 0x44BC2CF5AD770999u);
  EXPECT_EQ(*WireChecksum(proto::CHECKSUM_XXH3_64, WirePieces(&abc, 1)), 0x78AF5F94892F3950u);
  std::string big(100000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + (i >> 7));
  const absl::string_view whole = big;
  const absl::string_view pieces[] = {whole.substr(0, 7), whole.substr(7, 65536),
                                      whole.substr(65543)};
  for (proto::ChecksumKind kind : {proto::CHECKSUM_XXH64, proto::CHECKSUM_XXH3_64}) {
    EXPECT_EQ(*WireChecksum(kind, WirePieces(&whole, 1)), *WireChecksum(kind, pieces)) << kind;
  }
  EXPECT_NE(*WireChecksum(proto::CHECKSUM_XXH64, WirePieces(&whole, 1)),
            *WireChecksum(proto::CHECKSUM_XXH3_64, WirePieces(&whole, 1)));
}

TEST(WireChecksum, BlocksCarryTheKindTheyWereMadeWith) {
  std::vector<float> in = Ramp(300), out(300);
  for (bool raw : {true, false}) {
    DirectionCodec fast{raw, {}};
    DirectionCodec old{raw, {}, proto::CHECKSUM_XXH64};
    proto::CompressedBlock a, b;
    ASSERT_TRUE(EncodeWireBlock(fast, codec::DType::kF32, in.data(), 300, &a).ok());
    ASSERT_TRUE(EncodeWireBlock(old, codec::DType::kF32, in.data(), 300, &b).ok());
    EXPECT_EQ(a.checksum_kind(), proto::CHECKSUM_XXH3_64);
    EXPECT_EQ(b.checksum_kind(), proto::CHECKSUM_XXH64);
    EXPECT_EQ(a.data(), b.data());
    const absl::string_view data = a.data();
    EXPECT_EQ(a.checksum(), *WireChecksum(proto::CHECKSUM_XXH3_64, WirePieces(&data, 1)));
    EXPECT_EQ(b.checksum(), *WireChecksum(proto::CHECKSUM_XXH64, WirePieces(&data, 1)));
    ASSERT_TRUE(DecodeWireBlock(a, codec::DType::kF32, 300, out.data()).ok());
    ASSERT_TRUE(DecodeWireBlock(b, codec::DType::kF32, 300, out.data()).ok());
    // A block checked by one kind and labelled the other is corrupt, not accepted.
    proto::CompressedBlock swapped = a;
    swapped.set_checksum_kind(proto::CHECKSUM_XXH64);
    EXPECT_EQ(DecodeWireBlock(swapped, codec::DType::kF32, 300, out.data()).code(),
              absl::StatusCode::kDataLoss);
  }
}

TEST(WireChecksum, UnknownKindIsInvalidArgumentNamingIt) {
  std::vector<float> in = Ramp(10), out(10);
  proto::CompressedBlock b;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, in.data(), 10, &b).ok());
  b.set_checksum_kind(static_cast<proto::ChecksumKind>(7));
  const absl::Status s = DecodeWireBlock(b, codec::DType::kF32, 10, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("checksum kind 7"), absl::string_view::npos) << s;
}

TEST(WireChecksum, UseXxh64RechecksumsForPeersOfEarlierVersions) {
  std::vector<float> in = Ramp(200), out(200);
  proto::CompressedBlock b;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, in.data(), 200, &b).ok());
  ASSERT_EQ(b.checksum_kind(), proto::CHECKSUM_XXH3_64);
  const absl::string_view data = b.data();
  ASSERT_TRUE(UseXxh64(&b, WirePieces(&data, 1)).ok());
  // What an earlier version reads: the default kind (proto3 writes no field for it) and
  // the XXH64 of the payload.
  EXPECT_EQ(b.checksum_kind(), proto::CHECKSUM_XXH64);
  EXPECT_EQ(b.checksum(), *WireChecksum(proto::CHECKSUM_XXH64, WirePieces(&data, 1)));
  ASSERT_TRUE(DecodeWireBlock(b, codec::DType::kF32, 200, out.data()).ok());
  EXPECT_EQ(in, out);
  // A held block damaged since it was sealed gets no new seal.
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, in.data(), 200, &b).ok());
  (*b.mutable_data())[5] ^= 0x01;
  const uint64_t sealed = b.checksum();
  const absl::Status s = UseXxh64(&b);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(b.checksum(), sealed);
  EXPECT_EQ(b.checksum_kind(), proto::CHECKSUM_XXH3_64);
}

}  // namespace
}  // namespace gcomp::cluster
