#include "server/shard_service.h"

#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/wire_block.h"

namespace gcomp::server {
namespace {

using ::testing::HasSubstr;

proto::ClusterConfig Config(uint32_t workers, int shards = 1) {
  std::vector<std::string> o = {absl::StrCat("workers=", workers), "step_timeout_ms=300",
                                "rpc_timeout_ms=1000", "chunk_bytes=64"};
  std::string s;
  for (int i = 0; i < shards; ++i) s += absl::StrCat(i ? "," : "", "127.0.0.1:", 1000 + i);
  o.push_back("shards=" + s);
  return *ParseClusterConfig("job: j\n", o);
}

class ShardServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = ShardService::Create(Config(1), ShardOptions{});
    ASSERT_TRUE(s.ok()) << s.status();
    shard_ = *std::move(s);
    proto::DeclareTensorRequest d;
    d.set_job("j");
    d.set_key("w");
    d.set_dtype(proto::DTYPE_F32);
    d.set_elements(20);  // 16 elements per 64-byte chunk: chunks of 16 and 4
    d.set_shard_map_epoch(1);
    proto::DeclareTensorResponse r;
    ASSERT_TRUE(shard_->DeclareTensor(d, &r).ok());
    EXPECT_EQ(r.owned_chunks_size(), 2);
  }

  proto::CompressedBlock Block(uint32_t chunk, int64_t step, float value = 1.0f) {
    std::vector<float> v(chunk == 0 ? 16 : 4, value);
    proto::CompressedBlock b;
    EXPECT_TRUE(EncodeWireBlock(UplinkCodec(shard_->config()), codec::DType::kF32, v.data(),
                                v.size(), &b).ok());
    proto::BlockAddress* a = b.mutable_address();
    a->set_job("j");
    a->set_key("w");
    a->set_chunk(chunk);
    a->set_step(step);
    a->set_worker(0);
    a->set_shard_map_epoch(1);
    return b;
  }

  absl::Status Push(const proto::CompressedBlock& b) {
    proto::CompressedBlock out;
    return shard_->PushPull(b, absl::Now() + absl::Seconds(5), &out);
  }

  // Every rejected push must leave state unchanged: the next valid push still works.
  void ExpectUnchanged() {
    proto::StatsResponse stats;
    shard_->Stats(&stats);
    EXPECT_EQ(stats.steps_completed(), 0u);
    EXPECT_TRUE(Push(Block(0, 0, 2.0f)).ok());
  }

  std::unique_ptr<ShardService> shard_;
};

TEST_F(ShardServiceTest, PushPullReturnsTheMean) {
  proto::CompressedBlock out;
  ASSERT_TRUE(shard_->PushPull(Block(1, 0, 3.0f), absl::Now() + absl::Seconds(5), &out).ok());
  std::vector<float> v(4);
  ASSERT_TRUE(DecodeWireBlock(out, codec::DType::kF32, 4, v.data()).ok());
  EXPECT_EQ(v, std::vector<float>(4, 3.0f));
  EXPECT_EQ(out.address().chunk(), 1u);
  EXPECT_EQ(out.address().step(), 0);
}

TEST_F(ShardServiceTest, UnknownJobIsNotFound) {
  auto b = Block(0, 0);
  b.mutable_address()->set_job("other");
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kNotFound);
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, UnknownKeyIsNotFound) {
  auto b = Block(0, 0);
  b.mutable_address()->set_key("nope");
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kNotFound);
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, WrongEpochIsFailedPrecondition) {
  auto b = Block(0, 0);
  b.mutable_address()->set_shard_map_epoch(2);
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kFailedPrecondition);
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, CorruptBlockIsDataLoss) {
  auto b = Block(0, 0);
  (*b.mutable_data())[b.data().size() - 1] ^= 1;
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kDataLoss);
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, WrongDtypeIsInvalidArgument) {
  auto b = Block(0, 0);
  b.set_dtype(proto::DTYPE_BF16);
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, WrongSizeIsInvalidArgument) {
  auto b = Block(0, 0);
  b.set_elements(15);
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kInvalidArgument);
  auto c = Block(7, 0);
  EXPECT_EQ(Push(c).code(), absl::StatusCode::kInvalidArgument);  // no chunk 7
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, BadWorkerIsInvalidArgument) {
  auto b = Block(0, 0);
  b.mutable_address()->set_worker(1);
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kInvalidArgument);
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, OversizedBlockIsResourceExhausted) {
  auto b = Block(0, 0);
  b.mutable_data()->append(1 << 16, '\0');
  EXPECT_EQ(Push(b).code(), absl::StatusCode::kResourceExhausted);
  ExpectUnchanged();
}

TEST_F(ShardServiceTest, StaleAndFutureStepsAreFailedPrecondition) {
  ASSERT_TRUE(Push(Block(0, 3)).ok());
  ASSERT_TRUE(Push(Block(0, 4)).ok());
  auto stale = Push(Block(0, 2));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(stale.message()), HasSubstr("stale step 2"));
  EXPECT_EQ(Push(Block(0, 9)).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Push(Block(0, 5)).ok());
  EXPECT_TRUE(Push(Block(0, 5)).ok());  // retry of the completed step
  proto::StatsResponse stats;
  shard_->Stats(&stats);
  EXPECT_EQ(stats.steps_completed(), 3u);
  EXPECT_EQ(stats.duplicate_pushes(), 1u);
  EXPECT_EQ(stats.rejected_pushes(), 2u);
}

TEST_F(ShardServiceTest, ConflictingRedeclareIsAlreadyExists) {
  proto::DeclareTensorRequest d;
  d.set_job("j");
  d.set_key("w");
  d.set_dtype(proto::DTYPE_F32);
  d.set_elements(21);
  d.set_shard_map_epoch(1);
  proto::DeclareTensorResponse r;
  EXPECT_EQ(shard_->DeclareTensor(d, &r).code(), absl::StatusCode::kAlreadyExists);
  d.set_elements(20);
  EXPECT_TRUE(shard_->DeclareTensor(d, &r).ok());  // identical: idempotent
}

TEST(ShardService, MissingWorkerIsNamedAfterStepTimeout) {
  auto shard = *ShardService::Create(Config(2), ShardOptions{});
  proto::RegisterWorkerRequest reg;
  reg.set_job("j");
  reg.set_worker(1);
  reg.set_name("trainer-b");
  reg.set_shard_map_epoch(1);
  proto::RegisterWorkerResponse rr;
  ASSERT_TRUE(shard->RegisterWorker(reg, &rr).ok());
  proto::DeclareTensorRequest d;
  d.set_job("j");
  d.set_key("w");
  d.set_dtype(proto::DTYPE_F32);
  d.set_elements(4);
  d.set_shard_map_epoch(1);
  proto::DeclareTensorResponse dr;
  ASSERT_TRUE(shard->DeclareTensor(d, &dr).ok());
  std::vector<float> v(4, 1.0f);
  proto::CompressedBlock b, out;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), 4, &b).ok());
  b.mutable_address()->set_job("j");
  b.mutable_address()->set_key("w");
  b.mutable_address()->set_shard_map_epoch(1);
  absl::Time start = absl::Now();
  absl::Status s = shard->PushPull(b, absl::Now() + absl::Seconds(5), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("trainer-b"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ShardService, ChunkOfAnotherShardIsFailedPrecondition) {
  auto config = Config(1, 3);
  auto shard = *ShardService::Create(config, ShardOptions{0, 1});
  proto::DeclareTensorRequest d;
  d.set_job("j");
  d.set_key("big");
  d.set_dtype(proto::DTYPE_F32);
  d.set_elements(16 * 30);
  d.set_shard_map_epoch(1);
  proto::DeclareTensorResponse dr;
  ASSERT_TRUE(shard->DeclareTensor(d, &dr).ok());
  ASSERT_LT(dr.owned_chunks_size(), 30);
  std::vector<bool> owned(30, false);
  for (uint32_t c : dr.owned_chunks()) owned[c] = true;
  uint32_t other = 0;
  while (owned[other]) ++other;
  std::vector<float> v(16, 1.0f);
  proto::CompressedBlock b, out;
  ASSERT_TRUE(EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), 16, &b).ok());
  b.mutable_address()->set_job("j");
  b.mutable_address()->set_key("big");
  b.mutable_address()->set_chunk(other);
  b.mutable_address()->set_shard_map_epoch(1);
  EXPECT_EQ(shard->PushPull(b, absl::Now() + absl::Seconds(1), &out).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace gcomp::server
