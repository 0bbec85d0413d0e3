#include "server/chunk_state.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "cluster/wire_block.h"

namespace gcomp::server {
namespace {

std::vector<float> Edgy(size_t n, float scale) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * std::sin(static_cast<float>(i) * 0.37f);
  v[0] = -0.0f;
  v[1] = std::numeric_limits<float>::denorm_min();
  v[2] = std::numeric_limits<float>::infinity();
  uint32_t nan_bits = 0x7fc01234;
  std::memcpy(&v[3], &nan_bits, 4);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

ChunkSnapshot Sample(size_t n) {
  ChunkSnapshot s;
  s.started = true;
  s.current_step = 8;
  s.completed_step = 7;
  s.optimizer.value = Edgy(n, 1.5f);
  s.optimizer.m = Edgy(n, 1e-3f);
  s.optimizer.v = Edgy(n, 1e-7f);
  s.optimizer.steps = 8;
  auto result = std::make_shared<proto::CompressedBlock>();
  cluster::DirectionCodec lossless;
  lossless.policy.mode = codec::Mode::kLossless;
  EXPECT_TRUE(cluster::EncodeWireBlock(lossless, codec::DType::kF32, s.optimizer.value.data(), n,
                                       result.get())
                  .ok());
  result->mutable_address()->set_key("w");
  result->mutable_address()->set_chunk(3);
  result->mutable_address()->set_step(7);
  s.cached_result = result;
  return s;
}

TEST(ChunkState, RoundTripIsBitIdentical) {
  for (size_t n : {size_t{4}, size_t{1000}, size_t{65536}}) {
    ChunkSnapshot s = Sample(n);
    proto::ChunkState p;
    ASSERT_TRUE(ChunkStateToProto("j", "w", 3, n, s, &p).ok());
    // Through bytes, as a checkpoint file or a gRPC message carries it.
    proto::ChunkState q;
    ASSERT_TRUE(q.ParseFromString(p.SerializeAsString()));
    absl::StatusOr<ChunkSnapshot> back = ChunkStateFromProto(q, n, codec::DType::kF32);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->started);
    EXPECT_EQ(back->current_step, 8);
    EXPECT_EQ(back->completed_step, 7);
    EXPECT_EQ(back->optimizer.steps, 8);
    EXPECT_TRUE(SameBits(back->optimizer.value, s.optimizer.value));
    EXPECT_TRUE(SameBits(back->optimizer.m, s.optimizer.m));
    EXPECT_TRUE(SameBits(back->optimizer.v, s.optimizer.v));
    ASSERT_NE(back->cached_result, nullptr);
    EXPECT_EQ(back->cached_result->SerializeAsString(), s.cached_result->SerializeAsString());
  }
}

TEST(ChunkState, UnallocatedStateStaysEmpty) {
  ChunkSnapshot s;
  proto::ChunkState p;
  ASSERT_TRUE(ChunkStateToProto("j", "w", 0, 16, s, &p).ok());
  absl::StatusOr<ChunkSnapshot> back = ChunkStateFromProto(p, 16, codec::DType::kF32);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_FALSE(back->started);
  EXPECT_TRUE(back->optimizer.value.empty());
  EXPECT_EQ(back->cached_result, nullptr);
}

TEST(ChunkState, DamageIsRefusedNamingTheChunk) {
  ChunkSnapshot s = Sample(256);
  proto::ChunkState p;
  ASSERT_TRUE(ChunkStateToProto("j", "w", 3, 256, s, &p).ok());

  proto::ChunkState flipped = p;
  std::string* data = flipped.mutable_first_moment()->mutable_data();
  (*data)[data->size() / 2] ^= 0x10;
  absl::StatusOr<ChunkSnapshot> r = ChunkStateFromProto(flipped, 256, codec::DType::kF32);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
  EXPECT_NE(r.status().message().find("'w' chunk 3 first moment"), std::string::npos) << r.status();

  r = ChunkStateFromProto(p, 255, codec::DType::kF32);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  proto::ChunkState wrong_step = p;
  wrong_step.set_completed_step(6);
  r = ChunkStateFromProto(wrong_step, 256, codec::DType::kF32);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();

  proto::ChunkState near = p;
  near.mutable_value()->mutable_policy()->set_mode(proto::CODEC_MODE_NEAR_LOSSLESS);
  r = ChunkStateFromProto(near, 256, codec::DType::kF32);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
}

// What a peer sending state parts (a re-shard's Transfer, a Replicate) can make a shard
// buffer per chunk: blocks up to a chunk's encoded bound, and no unknown fields.
TEST(ChunkState, PartsAreBoundedByTheChunk) {
  proto::ChunkState part;
  part.set_key("w");
  part.set_chunk(3);
  part.mutable_first_moment()->set_data(
      std::string(cluster::MaxWireBytes(100, codec::DType::kF32), 'x'));
  EXPECT_TRUE(CheckChunkStatePart(part, 100, 64, "moved part").ok());
  part.mutable_cached_result()->set_data(
      std::string(cluster::MaxWireBytes(100, codec::DType::kF32) + 1, 'x'));
  const absl::Status s = CheckChunkStatePart(part, 100, 64, "moved part");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(s.message()).find("moved part of 'w' chunk 3 holds a block of"),
            std::string::npos)
      << s;
  // A name of any field past limits.max_key_bytes (a peer held 450 MB this way).
  part.mutable_cached_result()->clear_data();
  EXPECT_TRUE(CheckChunkStatePart(part, 100, 64, "moved part").ok());
  for (int field = 0; field < 3; ++field) {
    proto::ChunkState named = part;
    const std::string long_name(65, 'n');
    if (field == 0) named.set_job(long_name);
    if (field == 1) named.mutable_value()->mutable_address()->set_key(long_name);
    if (field == 2) named.mutable_second_moment()->mutable_address()->set_job(long_name);
    const absl::Status refused = CheckChunkStatePart(named, 100, 64, "replicated part");
    EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << field;
    EXPECT_NE(std::string(refused.message())
                  .find("holds a name of 65 bytes, above limits.max_key_bytes = 64"),
              std::string::npos)
        << refused;
  }
  proto::ChunkState with_unknown;
  with_unknown.set_key("w");
  with_unknown.mutable_value()->set_data("v");
  // Field 1000 is no field of ChunkState: protobuf would keep its megabyte as unknown.
  std::string bytes = with_unknown.SerializeAsString();
  bytes += std::string("\xc2\x3e", 2);      // tag of field 1000, wire type 2
  bytes += std::string("\x80\x80\x40", 3);  // length 1 MiB
  bytes += std::string(1 << 20, 'u');
  ASSERT_TRUE(with_unknown.ParseFromString(bytes));
  proto::ChunkState merged;
  MergeChunkStatePart(with_unknown, &merged);
  EXPECT_EQ(merged.value().data(), "v");
  EXPECT_LT(merged.ByteSizeLong(), size_t{100});
}

}  // namespace
}  // namespace gcomp::server
