#include "server/shard_service.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "absl/base/config.h"
#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/synchronization/notification.h"
#include "base/process_usage.h"
#include "cluster/shard_map.h"
#include "cluster/wire_block.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

proto::DeclareTensorRequest Declaration(const std::string& key, uint64_t elements) {
  proto::DeclareTensorRequest d;
  d.set_job("j");
  d.set_key(key);
  d.set_dtype(proto::DTYPE_F32);
  d.set_elements(elements);
  d.set_shard_map_epoch(1);
  return d;
}

uint64_t Rss() { return ReadProcessUsage(getpid())->rss_bytes; }

proto::ClusterConfig Config(uint32_t workers, int shards = 1,
                           std::vector<std::string> extra = {"chunk_bytes=64"}) {
  std::vector<std::string> o = {absl::StrCat("workers=", workers), "step_timeout_ms=300",
                                "rpc_timeout_ms=1000"};
  o.insert(o.end(), extra.begin(), extra.end());
  std::string s;
  for (int i = 0; i < shards; ++i) s += absl::StrCat(i ? "," : "", "127.0.0.1:", 1000 + i);
  o.push_back("shards=" + s);
  return *cluster::ParseClusterConfig("job: j\n", o);
}

TEST(ShardServiceOptions, DecodeThreadsOutOfRangeAreRefused) {
  for (int threads : {0, -1, kMaxDecodeThreads + 1, 100000}) {
    ShardOptions options;
    options.decode_threads = threads;
    auto s = ShardService::Create(Config(1), options);
    ASSERT_FALSE(s.ok()) << threads;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(absl::StrCat("got ", threads)), std::string::npos)
        << s.status();
  }
}

class ShardServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto s = ShardService::Create(Config(1), ShardOptions{});
    ASSERT_TRUE(s.ok()) << s.status();
    shard_ = *std::move(s);
    // 16 elements per 64-byte chunk: chunks of 16 and 4.
    proto::DeclareTensorRequest d = Declaration("w", 20);
    proto::DeclareTensorResponse r;
    ASSERT_TRUE(shard_->DeclareTensor(d, &r).ok());
    EXPECT_EQ(r.owned_chunks_size(), 2);
    EXPECT_EQ(r.owned_chunk_count(), 2u);
  }

  proto::CompressedBlock Block(uint32_t chunk, int64_t step, float value = 1.0f) {
    std::vector<float> v(chunk == 0 ? 16 : 4, value);
    proto::CompressedBlock b;
    EXPECT_TRUE(cluster::EncodeWireBlock(cluster::UplinkCodec(shard_->config()), codec::DType::kF32, v.data(),
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

// A declaration of 70,000 chunks here succeeded, but its reply listed every chunk (3 MB
// for a million) and could not be sent: the client saw an error and retried for good.
TEST_F(ShardServiceTest, AReplyListsTheOwnedChunksOnlyWhileTheListIsSmall) {
  proto::DeclareTensorResponse r;
  ASSERT_TRUE(shard_->DeclareTensor(Declaration("big", 16 * 70000), &r).ok());
  EXPECT_EQ(r.owned_chunk_count(), 70000u);
  EXPECT_EQ(r.owned_chunks_size(), 0);
  EXPECT_LT(r.ByteSizeLong(), 64u);
}

TEST_F(ShardServiceTest, PushPullReturnsTheMean) {
  proto::CompressedBlock out;
  ASSERT_TRUE(shard_->PushPull(Block(1, 0, 3.0f), absl::Now() + absl::Seconds(5), &out).ok());
  std::vector<float> v(4);
  ASSERT_TRUE(cluster::DecodeWireBlock(out, codec::DType::kF32, 4, v.data()).ok());
  EXPECT_EQ(v, std::vector<float>(4, 3.0f));
  EXPECT_EQ(out.address().chunk(), 1u);
  EXPECT_EQ(out.address().step(), 0);
}

// Workers of earlier versions check every block by XXH64 and send no kind: they get their
// replies and pulls that way; workers that read XXH3 get the result as it was made.
TEST_F(ShardServiceTest, RepliesUseTheChecksumKindTheCallerReads) {
  proto::RegisterWorkerRequest reg;
  reg.set_job("j");
  reg.set_shard_map_epoch(1);
  proto::RegisterWorkerResponse rr;
  ASSERT_TRUE(shard_->RegisterWorker(reg, &rr).ok());
  ASSERT_EQ(rr.checksums_read_size(), 1);
  EXPECT_EQ(rr.checksums_read(0), proto::CHECKSUM_XXH3_64);

  proto::CompressedBlock fast = Block(1, 0, 3.0f), old = fast, out_fast, out_old;
  ASSERT_EQ(fast.checksum_kind(), proto::CHECKSUM_XXH3_64);
  ASSERT_TRUE(cluster::UseXxh64(&old).ok());
  ASSERT_TRUE(shard_->PushPull(fast, absl::Now() + absl::Seconds(5), &out_fast).ok());
  ASSERT_TRUE(shard_->PushPull(old, absl::Now() + absl::Seconds(5), &out_old).ok());
  EXPECT_EQ(out_fast.checksum_kind(), proto::CHECKSUM_XXH3_64);
  EXPECT_EQ(out_old.checksum_kind(), proto::CHECKSUM_XXH64);
  EXPECT_EQ(out_fast.data(), out_old.data());
  for (const proto::CompressedBlock* out : {&out_fast, &out_old}) {
    std::vector<float> v(4);
    ASSERT_TRUE(cluster::DecodeWireBlock(*out, codec::DType::kF32, 4, v.data()).ok());
    EXPECT_EQ(v, std::vector<float>(4, 3.0f));
  }

  proto::PullRequest pull;
  pull.set_job("j");
  pull.set_key("w");
  pull.set_chunk(1);
  pull.set_shard_map_epoch(1);
  proto::CompressedBlock pulled;
  ASSERT_TRUE(shard_->Pull(pull, &pulled).ok());
  EXPECT_EQ(pulled.checksum_kind(), proto::CHECKSUM_XXH64);
  const absl::string_view data = pulled.data();
  EXPECT_EQ(pulled.checksum(), *cluster::WireChecksum(proto::CHECKSUM_XXH64,
                                                      cluster::WirePieces(&data, 1)));
  pull.add_checksums_read(proto::CHECKSUM_XXH3_64);
  ASSERT_TRUE(shard_->Pull(pull, &pulled).ok());
  EXPECT_EQ(pulled.checksum_kind(), proto::CHECKSUM_XXH3_64);
  EXPECT_TRUE(cluster::CheckWireBlock(pulled, codec::DType::kF32, 4).ok());
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
  absl::Status wrong = Push(b);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  // The usual cause, a worker with another chunk_bytes, is named.
  EXPECT_THAT(std::string(wrong.message()),
              HasSubstr("block holds 15 elements; chunk 0 of 'w' has 16 (this shard's "
                        "chunk_bytes is 64: does the worker's config set the same?)"));
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

// A second process registered with the same worker index takes it over: the first one's
// pushes are refused, naming the index, and change nothing; pushes without a session
// (clients before sessions) are not checked.
TEST_F(ShardServiceTest, PushesOfAProcessWhoseWorkerIndexWasTakenOverAreAlreadyExists) {
  auto register_as = [&](uint64_t session, const std::string& name) {
    proto::RegisterWorkerRequest reg;
    reg.set_job("j");
    reg.set_shard_map_epoch(1);
    reg.set_worker(0);
    reg.set_name(name);
    reg.set_session(session);
    proto::RegisterWorkerResponse rr;
    return shard_->RegisterWorker(reg, &rr);
  };
  auto block = [&](int64_t step, uint64_t session) {
    proto::CompressedBlock b = Block(1, step, 3.0f);
    b.mutable_address()->set_session(session);
    return b;
  };
  ASSERT_TRUE(register_as(0x1111, "host-a").ok());
  ASSERT_TRUE(Push(block(0, 0x1111)).ok());
  ASSERT_TRUE(register_as(0x2222, "host-b").ok());
  absl::Status s = Push(block(1, 0x1111));
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(s.message(), HasSubstr("another process registered as worker 0 ('host-b')"));
  proto::StatsResponse stats;
  shard_->Stats(&stats);
  EXPECT_EQ(stats.steps_completed(), 1u);
  EXPECT_TRUE(Push(block(1, 0x2222)).ok());
  EXPECT_TRUE(Push(block(2, 0)).ok());
  // Registering again (a map switch, a reconnect) keeps the latest process's index.
  ASSERT_TRUE(register_as(0x2222, "host-b").ok());
  EXPECT_TRUE(Push(block(3, 0x2222)).ok());
  EXPECT_EQ(Push(block(4, 0x1111)).code(), absl::StatusCode::kAlreadyExists);
}

// Two processes with one worker index, the first already waiting for the step's other
// worker when the second registers (a restarted worker): its wait ends long before the step
// would time out, and its contribution leaves the step, which takes the new process's
// gradient instead (it used to keep the replaced one's and take the new push for a retry).
// The replaced process, pushing again, learns that another took its index.
TEST(ShardServiceSessions, AWaitingPushEndsWhenAnotherProcessTakesItsWorkerIndex) {
  auto created = ShardService::Create(
      Config(2, 1, {"chunk_bytes=64", "step_timeout_ms=20000", "rpc_timeout_ms=30000"}),
      ShardOptions{});
  ASSERT_TRUE(created.ok()) << created.status();
  std::unique_ptr<ShardService> shard = *std::move(created);
  proto::DeclareTensorResponse declared;
  ASSERT_TRUE(shard->DeclareTensor(Declaration("w", 16), &declared).ok());
  auto register_as = [&](uint32_t worker, uint64_t session) {
    proto::RegisterWorkerRequest reg;
    reg.set_job("j");
    reg.set_shard_map_epoch(1);
    reg.set_worker(worker);
    reg.set_name(absl::StrCat("host-", session));
    reg.set_session(session);
    proto::RegisterWorkerResponse rr;
    return shard->RegisterWorker(reg, &rr);
  };
  auto push = [&](uint32_t worker, uint64_t session, float value) {
    std::vector<float> v(16, value);
    proto::CompressedBlock b, out;
    EXPECT_TRUE(cluster::EncodeWireBlock(cluster::UplinkCodec(shard->config()), codec::DType::kF32,
                                         v.data(), v.size(), &b)
                    .ok());
    proto::BlockAddress* a = b.mutable_address();
    a->set_job("j");
    a->set_key("w");
    a->set_step(0);
    a->set_worker(worker);
    a->set_session(session);
    a->set_shard_map_epoch(1);
    absl::Status st = shard->PushPull(b, absl::Now() + absl::Seconds(20), &out);
    std::vector<float> mean(16);
    if (st.ok()) {
      EXPECT_TRUE(cluster::DecodeWireBlock(out, codec::DType::kF32, 16, mean.data()).ok());
    }
    return std::make_pair(st, mean[0]);
  };
  ASSERT_TRUE(register_as(0, 0xa).ok());
  absl::Status first;
  absl::Duration waited;
  std::thread waiting([&] {
    const absl::Time start = absl::Now();
    first = push(0, 0xa, 2.0f).first;
    waited = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(200));  // the push is waiting for worker 1
  ASSERT_TRUE(register_as(0, 0xb).ok());
  waiting.join();
  EXPECT_EQ(first.code(), absl::StatusCode::kUnavailable) << first;
  EXPECT_THAT(first.message(), HasSubstr("a new process registered as worker 0 ('host-11')"));
  EXPECT_LT(waited, absl::Seconds(5));
  const absl::Status replaced = push(0, 0xa, 2.0f).first;
  EXPECT_EQ(replaced.code(), absl::StatusCode::kAlreadyExists) << replaced;
  EXPECT_THAT(replaced.message(), HasSubstr("another process registered as worker 0 ('host-11')"));
  // The step starts again: the new process's gradient and worker 1's.
  std::thread again([&] { EXPECT_EQ(push(0, 0xb, 100.0f).second, 52.0f); });
  auto [done, mean] = push(1, 0, 4.0f);
  again.join();
  EXPECT_TRUE(done.ok()) << done;
  EXPECT_EQ(mean, 52.0f);
  // Registering again from the same process drops nothing.
  ASSERT_TRUE(register_as(0, 0xb).ok());
}

// A replica sent to a job that keeps none says so, whatever else the message holds.
TEST_F(ShardServiceTest, AReplicaForAJobWithoutReplicasIsRefusedNamingThat) {
  proto::ReplicateRequest r;
  r.set_job("j");
  const absl::Status s = shard_->AcceptReplica(r);  // an empty key, too
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("keeps no replicas"));
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
  EXPECT_THAT(std::string(stale.message()), HasSubstr("a new job needs its own shards"));
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
  proto::DeclareTensorRequest d = Declaration("w", 21);
  proto::DeclareTensorResponse r;
  absl::Status s = shard_->DeclareTensor(d, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  // Both declarations are named: what the shard holds and what this request asked for.
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("already declared as f32 x 20; this request declares f32 x 21"));
  d.set_dtype(proto::DTYPE_BF16);
  d.set_elements(20);
  EXPECT_THAT(std::string(shard_->DeclareTensor(d, &r).message()),
              HasSubstr("this request declares bf16 x 20"));
  d.set_dtype(proto::DTYPE_F32);
  // Another optimizer (as after a restart whose config changed the learning rate, from a
  // checkpoint that keeps the old one): both settings named, and what to do.
  proto::OptimizerConfig* o = d.mutable_optimizer();
  o->set_name("momentum");
  o->set_learning_rate(0.001);
  o->set_momentum(0.9);
  o->set_beta1(0.9);
  o->set_beta2(0.999);
  o->set_epsilon(1e-8);
  const absl::Status other = shard_->DeclareTensor(d, &r);
  EXPECT_EQ(other.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(other.message()),
              HasSubstr("'w' already declared with optimizer none; this request declares it "
                        "with momentum (learning_rate 0.001, momentum 0.9). A key keeps its "
                        "optimizer settings, through checkpoints too"));
  d.clear_optimizer();
  EXPECT_TRUE(shard_->DeclareTensor(d, &r).ok());  // identical: idempotent
}

// A failover map from anyone holding the token would split a job without replicas (its
// shards at different epochs, chunks without owners): refused before anything changes.
TEST_F(ShardServiceTest, FailoverMapsNeedReplicas) {
  proto::InstallMapRequest r;
  *r.mutable_map() = shard_->config();
  r.mutable_map()->set_shard_map_epoch(2);
  const absl::Status s = shard_->InstallMap(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("config replicas: 1"));
  proto::StatsResponse stats;
  shard_->Stats(&stats);
  EXPECT_EQ(stats.shard_map_epoch(), 1u);
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
  proto::DeclareTensorRequest d = Declaration("w", 4);
  proto::DeclareTensorResponse dr;
  ASSERT_TRUE(shard->DeclareTensor(d, &dr).ok());
  std::vector<float> v(4, 1.0f);
  proto::CompressedBlock b, out;
  ASSERT_TRUE(cluster::EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), 4, &b).ok());
  b.mutable_address()->set_job("j");
  b.mutable_address()->set_key("w");
  b.mutable_address()->set_shard_map_epoch(1);
  absl::Time start = absl::Now();
  absl::Status s = shard->PushPull(b, absl::Now() + absl::Seconds(5), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(s.message()), HasSubstr("trainer-b"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

// A tensor of many chunks is placed outside the shard's lock (PlaceUnlocked); the chunks it
// owns are those of the map's placement, as for a small tensor placed under the lock.
TEST(ShardService, ManyChunksArePlacedAsTheMapSays) {
  for (const uint32_t chunks : {1000u, 70000u}) {
    auto config = Config(1, 3);
    auto shard = *ShardService::Create(config, ShardOptions{1, 1, {}});
    proto::DeclareTensorRequest d = Declaration("many", 16 * uint64_t{chunks});
    proto::DeclareTensorResponse dr;
    ASSERT_TRUE(shard->DeclareTensor(d, &dr).ok());
    const cluster::ChunkLayout layout(16 * uint64_t{chunks}, 4, 64);
    const std::vector<uint32_t> live = cluster::ShardMap(3, 1).LiveReplicas("many", layout, 1, {});
    std::vector<uint32_t> expected;
    for (uint32_t c = 0; c < chunks; ++c) {
      if (live[c] == 1) expected.push_back(c);
    }
    std::vector<uint32_t> got(dr.owned_chunks().begin(), dr.owned_chunks().end());
    std::sort(got.begin(), got.end());
    EXPECT_EQ(got, expected) << chunks << " chunks";
    EXPECT_GT(got.size(), chunks / 5);
  }
}

// A declaration of many chunks reserves its placement before making it: past the budget it
// is refused without allocating the placement (16 M chunks: 64 MiB of owners).
TEST(ShardService, APlacementPastTheBudgetIsRefusedBeforeItIsMade) {
  auto shard = *ShardService::Create(
      Config(1, 1, {"chunk_bytes=64", "limits.memory_budget_bytes=33554432"}), ShardOptions{});
  const uint64_t before = Rss();
  for (int i = 0; i < 4; ++i) {
    proto::DeclareTensorResponse dr;
    const absl::Status s =
        shard->DeclareTensor(Declaration(absl::StrCat("huge", i), uint64_t{1} << 30), &dr);
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("limits.memory_budget_bytes"));
  }
  EXPECT_LT(Rss(), before + (16u << 20));
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.tensors(), 0u);
  EXPECT_EQ(stats.memory_used_bytes(), 0u);
}

TEST(ShardService, ChunkOfAnotherShardIsFailedPrecondition) {
  auto config = Config(1, 3);
  auto shard = *ShardService::Create(config, ShardOptions{0, 1, {}});
  proto::DeclareTensorRequest d = Declaration("big", 16 * 30);
  proto::DeclareTensorResponse dr;
  ASSERT_TRUE(shard->DeclareTensor(d, &dr).ok());
  ASSERT_LT(dr.owned_chunks_size(), 30);
  std::vector<bool> owned(30, false);
  for (uint32_t c : dr.owned_chunks()) owned[c] = true;
  uint32_t other = 0;
  while (owned[other]) ++other;
  std::vector<float> v(16, 1.0f);
  proto::CompressedBlock b, out;
  ASSERT_TRUE(cluster::EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), 16, &b).ok());
  b.mutable_address()->set_job("j");
  b.mutable_address()->set_key("big");
  b.mutable_address()->set_chunk(other);
  b.mutable_address()->set_shard_map_epoch(1);
  const absl::Status s = shard->PushPull(b, absl::Now() + absl::Seconds(1), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  // With the same epoch, the likely cause: the worker's config lists the shards otherwise.
  EXPECT_THAT(std::string(s.message()), HasSubstr("same `shards:` list, in the same order"));
}

// A peer that backs up nothing here, or sends a part above one chunk's encoded bound, is
// refused before anything is kept; a part of the right size from the owner is taken.
TEST(ShardService, ReplicaAboveTheChunkBoundIsResourceExhausted) {
  auto shard = *ShardService::Create(Config(1, 3, {"chunk_bytes=64", "replicas=2"}),
                                     ShardOptions{0, 1, {}});
  proto::DeclareTensorResponse dr;
  ASSERT_TRUE(shard->DeclareTensor(Declaration("big", 16 * 30), &dr).ok());
  const size_t bound = cluster::MaxWireBytes(16, codec::DType::kF32);
  int refused = 0;
  for (uint32_t chunk = 0; chunk < 30; ++chunk) {
    for (uint32_t from : {1u, 2u}) {
      proto::ReplicateRequest r;
      r.set_job("j");
      r.set_shard_map_epoch(1);
      r.set_from_shard(from);
      proto::ChunkState* part = r.mutable_part();
      part->set_key("big");
      part->set_chunk(chunk);
      part->set_elements(16);
      part->mutable_value()->set_data(std::string(bound + 1, 'x'));
      absl::Status s = shard->AcceptReplica(r);
      ASSERT_NE(s.code(), absl::StatusCode::kOk) << "chunk " << chunk << " from " << from;
      if (s.code() != absl::StatusCode::kResourceExhausted) {
        // Not backed up here by that sender: refused for that, before the size matters.
        EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
        continue;
      }
      ++refused;
      EXPECT_THAT(std::string(s.message()),
                  AllOf(HasSubstr(absl::StrCat(bound + 1, " bytes")),
                        HasSubstr(absl::StrCat("bound ", bound))));
      // The same part within the bound is taken (it does not complete the state).
      part->mutable_value()->set_data(std::string(bound, 'x'));
      EXPECT_TRUE(shard->AcceptReplica(r).ok()) << "chunk " << chunk << " from " << from;
    }
  }
  // With 3 shards and 2 copies, shard 0 backs up some of the chunks the others own.
  EXPECT_GT(refused, 0);
}

// Workers and peers are refused by the same checks (CheckJob, the epoch checks,
// Tensor::CheckChunk); a worker is also told which job the shard serves.
TEST(ShardService, WorkersAndPeersGetTheSameRefusals) {
  auto shard = *ShardService::Create(Config(1, 3, {"chunk_bytes=64", "replicas=2"}),
                                     ShardOptions{0, 1, {}});
  proto::DeclareTensorResponse dr;
  ASSERT_TRUE(shard->DeclareTensor(Declaration("big", 16 * 30), &dr).ok());
  std::vector<float> v(16, 1.0f);
  proto::CompressedBlock push, out;
  ASSERT_TRUE(cluster::EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), 16, &push).ok());
  push.mutable_address()->set_job("j");
  push.mutable_address()->set_key("big");
  push.mutable_address()->set_shard_map_epoch(1);
  proto::ReplicateRequest replica;
  replica.set_job("j");
  replica.set_shard_map_epoch(1);
  replica.mutable_part()->set_key("big");
  auto push_status = [&] { return shard->PushPull(push, absl::Now() + absl::Milliseconds(50), &out); };

  push.mutable_address()->set_job("other");
  replica.set_job("other");
  EXPECT_EQ(push_status(), absl::NotFoundError("unknown job 'other' (shard serves job 'j')"));
  EXPECT_EQ(shard->AcceptReplica(replica), absl::NotFoundError("unknown job 'other'"));
  push.mutable_address()->set_job("j");
  replica.set_job("j");

  push.mutable_address()->set_shard_map_epoch(2);
  replica.set_shard_map_epoch(2);
  const absl::Status not_installed =
      absl::UnavailableError("shard-map epoch 2 is not installed on this shard yet; retry");
  EXPECT_EQ(push_status(), not_installed);
  EXPECT_EQ(shard->AcceptReplica(replica), not_installed);
  push.mutable_address()->set_shard_map_epoch(1);
  replica.set_shard_map_epoch(1);

  push.mutable_address()->set_chunk(30);
  replica.mutable_part()->set_chunk(30);
  const absl::Status past_last = absl::InvalidArgumentError("chunk 30 out of range: 'big' has 30 chunks");
  EXPECT_EQ(push_status(), past_last);
  EXPECT_EQ(shard->AcceptReplica(replica), past_last);
}

// The reports that opened the hostile-client work: one declaration of 2^36 f32 elements
// (16 GB allocated within seconds) and 400 declarations of 2^25 elements (OOM killer).
TEST(ShardServiceLimits, HugeDeclarationIsRefusedBeforeAllocating) {
  proto::ClusterConfig config = Config(2, 1, {"chunk_bytes=1048576"});
  auto shard = *ShardService::Create(config, ShardOptions{});
  const uint64_t rss = Rss();
  proto::DeclareTensorResponse r;
  absl::Status s = shard->DeclareTensor(Declaration("huge", uint64_t{1} << 36), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              AllOf(HasSubstr("limits.memory_budget_bytes"), HasSubstr("bytes in use"),
                    HasSubstr("declaring 'huge'"), HasSubstr("asks for")));
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.tensors(), 0u);
  EXPECT_EQ(stats.memory_used_bytes(), 0u);  // no trace
  EXPECT_EQ(stats.refused_by_limits(), 1u);
  EXPECT_LT(Rss(), rss + (64u << 20));
}

// Concurrent declarations of tensors far past the budget (a hostile peer's burst): each is
// refused before its chunks are placed, so the shard's memory does not go past the budget
// meanwhile (placing 4 M chunks took 32 MiB per call, half of it unreserved).
TEST(ShardServiceLimits, ConcurrentHugeDeclarationsAllocateNothing) {
  proto::ClusterConfig config = Config(2, 1, {"chunk_bytes=65536"});
  config.mutable_limits()->set_memory_budget_bytes(256ull << 20);
  auto shard = *ShardService::Create(config, ShardOptions{});
  const uint64_t rss = Rss();
  std::atomic<uint64_t> peak{rss};
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done.load()) {
      const uint64_t now = Rss();
      if (now > peak.load()) peak = now;
      absl::SleepFor(absl::Milliseconds(5));
    }
  });
  std::vector<std::thread> callers;
  std::atomic<int> refused{0};
  for (int t = 0; t < 16; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < 8; ++i) {
        proto::DeclareTensorResponse r;
        const absl::Status s = shard->DeclareTensor(
            Declaration(absl::StrCat("huge-", t, "-", i), uint64_t{1} << 36), &r);
        if (s.code() == absl::StatusCode::kResourceExhausted) ++refused;
      }
    });
  }
  for (auto& c : callers) c.join();
  done = true;
  sampler.join();
  EXPECT_EQ(refused.load(), 16 * 8);
  EXPECT_LT(peak.load(), rss + (64u << 20)) << "peak RSS grew by " << (peak.load() - rss);
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.memory_used_bytes(), 0u);
}

// What a declared tensor costs (its key is kept several times over: the map's key, the
// tensor's, its chunks' labels) is what the budget counts, or more: 8192 small tensors with
// 8-byte and 1 KiB keys. RSS is only a fair measure without a sanitizer's own memory.
TEST(ShardServiceLimits, TheBudgetCountsWhatADeclaredTensorTakes) {
#if defined(ABSL_HAVE_ADDRESS_SANITIZER) || defined(ABSL_HAVE_THREAD_SANITIZER)
  GTEST_SKIP() << "RSS under a sanitizer holds its shadow memory too";
#endif
  for (size_t key_bytes : {size_t{8}, size_t{1024}}) {
    proto::ClusterConfig config = Config(
        2, 1, {"chunk_bytes=65536", "limits.max_tensors=100000", "limits.max_key_bytes=2048"});
    auto shard = *ShardService::Create(config, ShardOptions{});
    const uint64_t rss = Rss();
    const int n = 8192;
    for (int i = 0; i < n; ++i) {
      proto::DeclareTensorResponse r;
      std::string key = absl::StrCat(i, "-");
      key.resize(key_bytes, 'k');
      ASSERT_TRUE(shard->DeclareTensor(Declaration(key, 16), &r).ok());
    }
    proto::StatsResponse stats;
    shard->Stats(&stats);
    EXPECT_GE(stats.memory_used_bytes(), Rss() - rss) << "keys of " << key_bytes << " bytes";
  }
}

TEST(ShardServiceLimits, ManyLargeDeclarationsStopAtTheBudget) {
  proto::ClusterConfig config = Config(2, 1, {"chunk_bytes=1048576"});
  config.mutable_limits()->set_memory_budget_bytes(1ull << 30);
  auto shard = *ShardService::Create(config, ShardOptions{});
  const uint64_t rss = Rss();
  int accepted = 0, refused = 0;
  for (int i = 0; i < 400; ++i) {
    proto::DeclareTensorResponse r;
    absl::Status s =
        shard->DeclareTensor(Declaration(absl::StrCat("t", i), uint64_t{1} << 25), &r);
    if (s.ok()) {
      ++accepted;
    } else {
      ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
      ++refused;
    }
  }
  // 128 MiB of values plus the cached result at the codec's bound per tensor.
  EXPECT_GE(accepted, 2);
  EXPECT_LE(accepted, 4);
  EXPECT_EQ(accepted + refused, 400);
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.tensors(), static_cast<uint64_t>(accepted));
  EXPECT_LE(stats.memory_used_bytes(), 1ull << 30);
  // Declared state is allocated lazily: nothing was pushed, so almost nothing is resident.
  EXPECT_LT(Rss(), rss + (64u << 20));
}

TEST(ShardServiceLimits, TensorCountAndKeyLengthAreBounded) {
  proto::ClusterConfig config = Config(1);
  config.mutable_limits()->set_max_tensors(3);
  config.mutable_limits()->set_max_key_bytes(8);
  auto shard = *ShardService::Create(config, ShardOptions{});
  proto::DeclareTensorResponse r;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(shard->DeclareTensor(Declaration(absl::StrCat("k", i), 4), &r).ok());
  absl::Status s = shard->DeclareTensor(Declaration("k3", 4), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.max_tensors = 3"));
  EXPECT_TRUE(shard->DeclareTensor(Declaration("k1", 4), &r).ok());  // redeclaring is fine
  s = shard->DeclareTensor(Declaration("a-very-long-key", 4), &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.max_key_bytes = 8"));
  proto::PullRequest pull;
  pull.set_job("j");
  pull.set_key(std::string(1 << 20, 'x'));
  pull.set_shard_map_epoch(1);
  proto::CompressedBlock out;
  EXPECT_EQ(shard->Pull(pull, &out).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardServiceLimits, LongWorkerNameIsRefused) {
  auto shard = *ShardService::Create(Config(1), ShardOptions{});
  proto::RegisterWorkerRequest reg;
  reg.set_job("j");
  reg.set_shard_map_epoch(1);
  reg.set_name(std::string(5000, 'n'));
  proto::RegisterWorkerResponse rr;
  absl::Status s = shard->RegisterWorker(reg, &rr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.max_key_bytes"));
}

// A worker whose copy of the cluster config differs from the shard's in what the shard
// decodes by was accepted: near-lossless blocks into a lossless job were averaged as sent.
TEST(ShardServiceLimits, AWorkerWithAnotherConfigIsRefusedNamingBoth) {
  auto shard = *ShardService::Create(Config(2, 1, {"chunk_bytes=64", "uplink.mode=lossless"}),
                                     ShardOptions{});
  proto::RegisterWorkerRequest reg;
  reg.set_job("j");
  reg.set_shard_map_epoch(1);
  proto::RegisterWorkerResponse rr;
  ASSERT_TRUE(shard->RegisterWorker(reg, &rr).ok());  // a client that sends none of them
  reg.mutable_uplink()->set_mode("lossless");
  reg.mutable_uplink()->set_rel_bits(2);  // not part of a lossless setting
  reg.set_chunk_bytes(64);
  reg.set_workers(2);
  ASSERT_TRUE(shard->RegisterWorker(reg, &rr).ok());
  proto::RegisterWorkerRequest other = reg;
  other.mutable_uplink()->set_mode("near-lossless");
  other.mutable_uplink()->set_abs_log2(-4);
  other.set_chunk_bytes(128);
  other.set_workers(3);
  other.set_worker(2);
  absl::Status s = shard->RegisterWorker(other, &rr);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("worker 2's cluster config disagrees with shard 0's: uplink "
                        "near-lossless (rel_bits 2, abs_log2 -4) against lossless; chunk_bytes "
                        "128 against 64; workers 3 against 2 (the worker's first)"));
  other = reg;
  other.mutable_uplink()->set_mode("none");
  EXPECT_THAT(std::string(shard->RegisterWorker(other, &rr).message()),
              HasSubstr("uplink none against lossless (the worker"));
}

// A second re-shard committed while the first still sent its moved chunks (to a new shard
// that did not answer) joined the first's thread under the shard's lock, which that thread
// needed: every call hung from then on, SIGTERM included. Now the second Prepare is refused
// until the moves are done, and nothing waits under the lock.
TEST(ShardServiceReshard, ANewReshardWaitsForTheLastOnesMoves) {
  absl::Notification release;
  std::atomic<int> sends{0};
  ShardOptions options;
  options.peers.send_transfer = [&](const std::string&, const proto::TransferRequest&) {
    ++sends;
    release.WaitForNotification();  // a new shard that does not answer yet
    return absl::OkStatus();
  };
  const proto::ClusterConfig one = Config(1);
  auto shard = *ShardService::Create(one, options);
  // Before the shard's destructor (which joins the sending thread), however the test ends.
  absl::Cleanup unblock = [&] {
    if (!release.HasBeenNotified()) release.Notify();
  };
  proto::DeclareTensorResponse declared;
  ASSERT_TRUE(shard->DeclareTensor(Declaration("w", 16 * 20), &declared).ok());
  const auto prepare = [&](const std::vector<std::string>& shards, uint64_t epoch) {
    proto::PrepareReshardRequest r;
    *r.mutable_next() = one;
    r.mutable_next()->clear_shards();
    for (const std::string& a : shards) r.mutable_next()->add_shards(a);
    r.mutable_next()->set_shard_map_epoch(epoch);
    r.set_old_shards(1);
    return shard->PrepareReshard(r);
  };
  const auto in_progress = [&] {
    const std::string text = shard->metrics()->Text();
    return text.find("gcomp_shard_reshard_in_progress{gcomp_job=\"j\",shard=\"0\"} 1") !=
           std::string::npos;
  };
  EXPECT_FALSE(in_progress());
  ASSERT_TRUE(prepare({"127.0.0.1:1000", "127.0.0.1:1001"}, 2).ok());
  EXPECT_TRUE(in_progress());  // what the re-shard-stuck alert watches
  ASSERT_TRUE(shard->CommitReshard(2, 0).ok());
  while (sends.load() == 0) absl::SleepFor(absl::Milliseconds(1));
  absl::StatusOr<proto::PrepareReshardResponse> second = prepare({"127.0.0.1:1000"}, 3);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(std::string(second.status().message()),
              HasSubstr("still sending the chunks that the re-shard to epoch 2 moved away"));
  proto::StatsResponse stats;
  shard->Stats(&stats);  // answers: the lock is free
  EXPECT_EQ(stats.shard_map_epoch(), 2u);
  std::move(unblock).Invoke();
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (!(second = prepare({"127.0.0.1:1000"}, 3)).ok() && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(shard->CommitReshard(3, 1).ok());
  EXPECT_TRUE(in_progress());  // committed, its switch step (1) not reached: still under way
}

// Any peer could have a live shard failed over: a report while that shard refused calls as
// busy (its request threads taken by a flood) counted the refusal as "down", and two shards
// then served its chunks. Reports beyond 16 that come while one is coordinated are answered
// at once (queued reports each held a request thread).
TEST(ShardServiceFailover, ABusyPeerIsNotDownAndFewReportsWait) {
  absl::Notification release;
  std::atomic<int> probes{0};
  std::atomic<bool> block{false};
  ShardOptions options;
  options.peers.probe = [&](const std::string&, absl::Duration) {
    ++probes;
    if (block) release.WaitForNotification();
    return absl::ResourceExhaustedError("Server Threadpool Exhausted");
  };
  auto shard = *ShardService::Create(Config(1, 2, {"chunk_bytes=64", "replicas=2"}), options);
  absl::Cleanup unblock = [&] {
    if (!release.HasBeenNotified()) release.Notify();
  };
  proto::ReportDownRequest report;
  report.set_job("j");
  report.set_shard_map_epoch(1);
  report.set_shard(1);
  report.set_forwarded(true);
  proto::ReportDownResponse response;
  ASSERT_TRUE(shard->ReportDown(report, &response).ok());
  EXPECT_GE(probes.load(), 1);
  EXPECT_EQ(response.shard_map_epoch(), 1u) << "a busy peer was failed over";
  EXPECT_EQ(response.down_shards_size(), 0);

  // 20 reports while the coordination's probe is held: 16 are let in (one coordinates, 15
  // wait), the other 4 are answered at once.
  block = true;
  std::vector<std::thread> reports;
  std::atomic<int> ok{0}, refused{0};
  for (int i = 0; i < 20; ++i) {
    reports.emplace_back([&] {
      proto::ReportDownResponse r;
      const absl::Status s = shard->ReportDown(report, &r);
      if (s.ok()) ++ok;
      if (absl::IsUnavailable(s) &&
          absl::StrContains(s.message(), "more than 16 down reports wait for the failover")) {
        ++refused;
      }
    });
  }
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (refused.load() < 4 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(1));
  EXPECT_EQ(refused.load(), 4);
  EXPECT_EQ(ok.load(), 0);  // held by the first one's probe
  std::move(unblock).Invoke();
  for (std::thread& t : reports) t.join();
  EXPECT_EQ(ok.load(), 16);
  EXPECT_EQ(refused.load(), 4);
}

TEST(ShardServiceLimits, BadInitialValueLeavesNoTensor) {
  auto shard = *ShardService::Create(Config(1), ShardOptions{});
  proto::DeclareTensorRequest d = Declaration("w", 20);
  proto::ChunkValue* init = d.add_initial();
  init->set_chunk(9);
  init->set_data(std::string(64, '\0'));
  proto::DeclareTensorResponse r;
  EXPECT_EQ(shard->DeclareTensor(d, &r).code(), absl::StatusCode::kInvalidArgument);
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.tensors(), 0u);
  EXPECT_EQ(stats.memory_used_bytes(), 0u);
}

TEST(ShardServiceLimits, PushWhoseStepBufferDoesNotFitIsRefusedWithoutTrace) {
  // 2 workers, one tensor of 256 Ki floats in one chunk: the declaration reserves the
  // value and the cached result (~2 MiB), each step buffer needs 1 MiB more.
  proto::ClusterConfig config = Config(2, 1, {"chunk_bytes=1048576"});
  config.mutable_limits()->set_memory_budget_bytes(3ull << 20);
  auto shard = *ShardService::Create(config, ShardOptions{});
  proto::DeclareTensorResponse r;
  ASSERT_TRUE(shard->DeclareTensor(Declaration("w", 1 << 18), &r).ok());
  proto::StatsResponse before;
  shard->Stats(&before);
  ASSERT_GT(before.memory_used_bytes(), 2ull << 20);
  std::vector<float> v(1 << 18, 1.0f);
  proto::CompressedBlock b, out;
  ASSERT_TRUE(cluster::EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), v.size(), &b).ok());
  b.mutable_address()->set_job("j");
  b.mutable_address()->set_key("w");
  b.mutable_address()->set_shard_map_epoch(1);
  absl::Status s = shard->PushPull(b, absl::Now() + absl::Seconds(5), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("step buffer for key 'w' chunk 0"));
  proto::StatsResponse after;
  shard->Stats(&after);
  EXPECT_EQ(after.memory_used_bytes(), before.memory_used_bytes());
  EXPECT_EQ(after.pending_steps(), 0u);
  EXPECT_EQ(after.pushes(), 0u);
}

TEST(ShardServiceLimits, PendingStepsAreBoundedAndFreedWhenStepsComplete) {
  proto::ClusterConfig config = Config(2);
  config.mutable_limits()->set_max_pending_steps(1);
  auto shard = *ShardService::Create(config, ShardOptions{});
  proto::DeclareTensorResponse r;
  ASSERT_TRUE(shard->DeclareTensor(Declaration("w", 32), &r).ok());  // 2 chunks of 16
  auto block = [](uint32_t chunk, uint32_t worker) {
    std::vector<float> v(16, 1.0f);
    proto::CompressedBlock b;
    EXPECT_TRUE(cluster::EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), 16, &b).ok());
    b.mutable_address()->set_job("j");
    b.mutable_address()->set_key("w");
    b.mutable_address()->set_chunk(chunk);
    b.mutable_address()->set_worker(worker);
    b.mutable_address()->set_shard_map_epoch(1);
    return b;
  };
  std::thread first([&] {
    proto::CompressedBlock out;
    EXPECT_TRUE(shard->PushPull(block(0, 0), absl::Now() + absl::Seconds(5), &out).ok());
  });
  proto::StatsResponse stats;
  do {
    absl::SleepFor(absl::Milliseconds(2));
    shard->Stats(&stats);
  } while (stats.pending_steps() == 0);
  proto::CompressedBlock out;
  absl::Status s = shard->PushPull(block(1, 0), absl::Now() + absl::Seconds(5), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("limits.max_pending_steps = 1"));
  EXPECT_TRUE(shard->PushPull(block(0, 1), absl::Now() + absl::Seconds(5), &out).ok());
  first.join();
  shard->Stats(&stats);
  EXPECT_EQ(stats.pending_steps(), 0u);
  EXPECT_EQ(stats.pending_bytes(), 0u);
  // With chunk 0 done, chunk 1 may start its step.
  std::thread second([&] {
    proto::CompressedBlock o;
    EXPECT_TRUE(shard->PushPull(block(1, 0), absl::Now() + absl::Seconds(5), &o).ok());
  });
  EXPECT_TRUE(shard->PushPull(block(1, 1), absl::Now() + absl::Seconds(5), &out).ok());
  second.join();
}

// A client pushed one chunk of each of many tensors with a short deadline and left: each
// step timed out with nobody waiting, and only a later push to the same chunk reaped it.
// Their slots refused every honest step for good; the shard now frees them itself.
TEST(ShardServiceLimits, StepsLeftPendingByAClientThatLeftAreFreed) {
  proto::ClusterConfig config = Config(2);  // step_timeout_ms=300
  config.mutable_limits()->set_max_pending_steps(2);
  auto shard = *ShardService::Create(config, ShardOptions{});
  proto::DeclareTensorResponse r;
  for (const char* key : {"a", "b", "honest"}) {
    ASSERT_TRUE(shard->DeclareTensor(Declaration(key, 16), &r).ok());
  }
  auto block = [](const std::string& key, uint32_t worker) {
    std::vector<float> v(16, 1.0f);
    proto::CompressedBlock b;
    EXPECT_TRUE(cluster::EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), 16, &b).ok());
    b.mutable_address()->set_job("j");
    b.mutable_address()->set_key(key);
    b.mutable_address()->set_worker(worker);
    b.mutable_address()->set_shard_map_epoch(1);
    return b;
  };
  proto::CompressedBlock out;
  for (const char* key : {"a", "b"}) {
    EXPECT_EQ(shard->PushPull(block(key, 0), absl::Now() + absl::Milliseconds(20), &out).code(),
              absl::StatusCode::kDeadlineExceeded);
  }
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.pending_steps(), 2u);
  // Past the step timeout and the shard's once-a-second check, nobody having pushed "a" or
  // "b" again: their slots are free, and an honest step goes through.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  do {
    absl::SleepFor(absl::Milliseconds(50));
    shard->Stats(&stats);
  } while (stats.pending_steps() != 0 && absl::Now() < until);
  EXPECT_EQ(stats.pending_steps(), 0u);
  std::thread first([&] {
    proto::CompressedBlock o;
    EXPECT_TRUE(shard->PushPull(block("honest", 0), absl::Now() + absl::Seconds(5), &o).ok());
  });
  EXPECT_TRUE(shard->PushPull(block("honest", 1), absl::Now() + absl::Seconds(5), &out).ok());
  first.join();
}

}  // namespace
}  // namespace gcomp::server
