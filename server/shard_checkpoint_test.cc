// Checkpoint and restore through ShardService: training resumed from a checkpoint (into the
// same or another number of shards) continues bit for bit like an uninterrupted run.
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "cluster/cluster_config.h"
#include "cluster/wire_block.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "server/shard_service.h"

namespace gcomp::server {
namespace {

constexpr uint32_t kWorkers = 3;
// Two tensors of 16-element chunks (chunk_bytes 64): 7 and 3 chunks.
const std::vector<std::pair<std::string, size_t>> kTensors = {{"w", 100}, {"b", 40}};

std::string TempDir() {
  std::string tmpl = absl::StrCat(::testing::TempDir(), "/shardckptXXXXXX");
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

proto::ClusterConfig Config(int shards, const std::string& dir, int every_steps,
                            const std::string& optimizer = "adam",
                            const std::string& chunk_bytes = "64") {
  std::vector<std::string> o = {
      absl::StrCat("workers=", kWorkers), "chunk_bytes=" + chunk_bytes, "uplink.mode=lossless",
      "downlink.mode=lossless", "optimizer.name=" + optimizer, "optimizer.learning_rate=0.05",
      "step_timeout_ms=5000", "rpc_timeout_ms=10000"};
  if (!dir.empty()) {
    o.push_back("checkpoint.dir=" + dir);
    o.push_back(absl::StrCat("checkpoint.every_steps=", every_steps));
  }
  std::string s;
  for (int i = 0; i < shards; ++i) s += absl::StrCat(i ? "," : "", "127.0.0.1:", 1000 + i);
  o.push_back("shards=" + s);
  absl::StatusOr<proto::ClusterConfig> c = cluster::ParseClusterConfig("job: j\n", o);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// The sets of job "j" (Config's) under checkpoint root `dir`.
std::string JobDir(const std::string& dir) { return dir + "/j"; }

float Gradient(uint32_t worker, int64_t step, size_t i) {
  return std::sin(0.1f * static_cast<float>(i) + 0.7f * static_cast<float>(step)) *
         static_cast<float>(worker + 1) * 1e-2f;
}

// Shards of one job plus the workers' view of who owns what.
class Job {
 public:
  Job(const proto::ClusterConfig& config) : config_(config) {
    for (int k = 0; k < config.shards_size(); ++k) {
      absl::StatusOr<std::unique_ptr<ShardService>> s =
          ShardService::Create(config, ShardOptions{static_cast<uint32_t>(k), 2, {}});
      if (!s.ok()) {
        status_ = s.status();
        return;
      }
      shards_.push_back(*std::move(s));
    }
  }
  const absl::Status& status() const { return status_; }
  ShardService* shard(int k) { return shards_[k].get(); }

  // Every shard gets every declaration with initial values (as worker::Client sends them).
  void Declare() {
    for (const auto& [key, n] : kTensors) {
      std::vector<float> init(n);
      for (size_t i = 0; i < n; ++i) init[i] = 0.5f - 0.01f * static_cast<float>(i);
      const size_t per_chunk = 16;
      for (auto& shard : shards_) {
        proto::DeclareTensorRequest d;
        d.set_job("j");
        d.set_key(key);
        d.set_dtype(proto::DTYPE_F32);
        d.set_elements(n);
        d.set_shard_map_epoch(config_.shard_map_epoch());
        for (size_t c = 0; c * per_chunk < n; ++c) {
          proto::ChunkValue* v = d.add_initial();
          v->set_chunk(c);
          const size_t len = std::min(per_chunk, n - c * per_chunk);
          v->set_data(std::string(reinterpret_cast<const char*>(init.data() + c * per_chunk), len * 4));
        }
        proto::DeclareTensorResponse r;
        absl::Status s = shard->DeclareTensor(d, &r);
        ASSERT_TRUE(s.ok()) << s;
        for (uint32_t c : r.owned_chunks()) owner_[absl::StrCat(key, "/", c)] = shard.get();
      }
    }
  }

  // One training step: every worker pushes every chunk (concurrently across workers).
  void Step(int64_t step) {
    std::vector<std::thread> threads;
    for (uint32_t w = 0; w < kWorkers; ++w) {
      threads.emplace_back([this, w, step] {
        for (const auto& [key, n] : kTensors) {
          for (size_t c = 0; c * 16 < n; ++c) {
            const size_t len = std::min<size_t>(16, n - c * 16);
            std::vector<float> g(len);
            for (size_t i = 0; i < len; ++i) g[i] = Gradient(w, step, c * 16 + i);
            proto::CompressedBlock b, out;
            ASSERT_TRUE(cluster::EncodeWireBlock(cluster::UplinkCodec(config_), codec::DType::kF32,
                                                 g.data(), len, &b)
                            .ok());
            proto::BlockAddress* a = b.mutable_address();
            a->set_job("j");
            a->set_key(key);
            a->set_chunk(c);
            a->set_step(step);
            a->set_worker(w);
            a->set_shard_map_epoch(config_.shard_map_epoch());
            absl::Status s = owner_.at(absl::StrCat(key, "/", c))
                                 ->PushPull(b, absl::Now() + absl::Seconds(10), &out);
            ASSERT_TRUE(s.ok()) << s;
          }
        }
      });
    }
    for (auto& t : threads) t.join();
  }

  // Every tensor's current value, concatenated, as raw bits.
  std::vector<uint32_t> Values() {
    std::vector<uint32_t> bits;
    for (const auto& [key, n] : kTensors) {
      for (size_t c = 0; c * 16 < n; ++c) {
        const size_t len = std::min<size_t>(16, n - c * 16);
        proto::PullRequest r;
        r.set_job("j");
        r.set_key(key);
        r.set_chunk(c);
        r.set_shard_map_epoch(config_.shard_map_epoch());
        proto::CompressedBlock out;
        absl::Status s = owner_.at(absl::StrCat(key, "/", c))->Pull(r, &out);
        EXPECT_TRUE(s.ok()) << s;
        std::vector<uint32_t> v(len);
        EXPECT_TRUE(cluster::DecodeWireBlock(out, codec::DType::kF32, len, v.data()).ok());
        bits.insert(bits.end(), v.begin(), v.end());
      }
    }
    return bits;
  }

  ShardService* Owner(const std::string& key, uint32_t chunk) {
    return owner_.at(absl::StrCat(key, "/", chunk));
  }

 private:
  proto::ClusterConfig config_;
  absl::Status status_;
  std::vector<std::unique_ptr<ShardService>> shards_;
  std::map<std::string, ShardService*> owner_;
};

struct Reference {
  std::vector<uint32_t> at5, at9;
};

Reference Uninterrupted(const std::string& optimizer) {
  Reference ref;
  Job job(Config(2, "", 0, optimizer));
  EXPECT_TRUE(job.status().ok());
  job.Declare();
  for (int64_t s = 0; s < 10; ++s) {
    job.Step(s);
    if (s == 5) ref.at5 = job.Values();
  }
  ref.at9 = job.Values();
  return ref;
}

// Three shards restore the newest set of `dir` (step 5), as left by a job with `optimizer`,
// and go on to step 9 bit-identical to the uninterrupted run `ref`.
void ExpectResumesInThreeShardsAtStep5(const std::string& dir, const std::string& optimizer,
                                       const Reference& ref) {
  Job job(Config(3, dir, 0, optimizer));
  ASSERT_TRUE(job.status().ok()) << job.status();
  for (int k = 0; k < 3; ++k) EXPECT_EQ(job.shard(k)->restored_step(), 5);
  job.Declare();  // workers re-declare after the restart: idempotent, initial values ignored
  EXPECT_EQ(job.Values(), ref.at5);
  for (int64_t s = 6; s < 10; ++s) job.Step(s);
  EXPECT_EQ(job.Values(), ref.at9);
}

// Declares `key` (64 f32 elements, 4 chunks of 16: both of two shards own some) on every
// shard of `job`, as a worker that never pushes it would.
void DeclareUnpushed(Job& job, int shards, const std::string& key) {
  for (int k = 0; k < shards; ++k) {
    proto::DeclareTensorRequest d;
    d.set_job("j");
    d.set_key(key);
    d.set_dtype(proto::DTYPE_F32);
    d.set_elements(64);
    d.set_shard_map_epoch(1);
    proto::DeclareTensorResponse r;
    ASSERT_TRUE(job.shard(k)->DeclareTensor(d, &r).ok());
  }
}

class ShardCheckpoint : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardCheckpoint, PeriodicCheckpointOfTwoShardsResumesInThreeBitIdentical) {
  const Reference ref = Uninterrupted(GetParam());
  const std::string dir = TempDir();
  {
    Job job(Config(2, dir, 6, GetParam()));  // (5 + 1) % 6 == 0: a checkpoint of step 5
    ASSERT_TRUE(job.status().ok()) << job.status();
    job.Declare();
    for (int64_t s = 0; s < 8; ++s) job.Step(s);  // goes past it; the job then dies
    for (int k = 0; k < 2; ++k) job.shard(k)->FlushCheckpoints();
  }
  ExpectResumesInThreeShardsAtStep5(dir, GetParam(), ref);
}

// 10 chunks on 16 shards: at least 6 shards own none, complete no step and write no
// periodic manifest. The sets are complete all the same (the others name them idle).
TEST_P(ShardCheckpoint, PeriodicCheckpointWithShardsThatOwnNoChunkResumesBitIdentical) {
  const Reference ref = Uninterrupted(GetParam());
  const std::string dir = TempDir();
  {
    Job job(Config(16, dir, 6, GetParam()));
    ASSERT_TRUE(job.status().ok()) << job.status();
    job.Declare();
    for (int64_t s = 0; s < 8; ++s) job.Step(s);
    for (int k = 0; k < 16; ++k) job.shard(k)->FlushCheckpoints();
  }
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(JobDir(dir));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 5);
  EXPECT_TRUE(loaded->skipped.empty()) << loaded->skipped[0];
  ExpectResumesInThreeShardsAtStep5(dir, GetParam(), ref);
}

// A tensor declared and never pushed (a worker that died before its first push, an old
// model's keys) completes no step: its chunks were missing from every periodic set, which
// then stayed pending in memory and never reached disk. Now a set is written once the next
// boundary's first snapshot arrives, with such chunks as they are.
TEST_P(ShardCheckpoint, PeriodicCheckpointsGoOnPastATensorThatIsNeverPushed) {
  const Reference ref = Uninterrupted(GetParam());
  const std::string dir = TempDir();
  {
    Job job(Config(2, dir, 3, GetParam()));  // boundaries after steps 2, 5 and 8
    ASSERT_TRUE(job.status().ok()) << job.status();
    job.Declare();
    DeclareUnpushed(job, 2, "never_pushed");
    for (int64_t s = 0; s < 9; ++s) job.Step(s);
    for (int k = 0; k < 2; ++k) job.shard(k)->FlushCheckpoints();
  }
  std::vector<int64_t> steps;
  for (const CheckpointSetSummary& set : ListCheckpointSets(JobDir(dir))) {
    EXPECT_TRUE(set.problem.empty()) << set.path << ": " << set.problem;
    steps.push_back(set.step);
  }
  EXPECT_EQ(steps, (std::vector<int64_t>{5, 2}));  // 8's set waits for the next boundary
  ExpectResumesInThreeShardsAtStep5(dir, GetParam(), ref);
}

// A set a shard writes late (filled at the next boundary) must not name a tensor declared
// after its boundary: a shard that wrote the set earlier holds none of that tensor's
// chunks, and the set would not restore. Such a set is skipped; the next one holds it.
TEST_P(ShardCheckpoint, ASetIsSkippedWhenATensorWasDeclaredAfterItsBoundary) {
  const std::string dir = TempDir();
  Job job(Config(2, dir, 3, GetParam()));  // boundaries after steps 2, 5 and 8
  ASSERT_TRUE(job.status().ok()) << job.status();
  job.Declare();
  DeclareUnpushed(job, 2, "never_pushed");
  for (int64_t s = 0; s < 4; ++s) job.Step(s);  // step 2's sets wait for never_pushed
  DeclareUnpushed(job, 2, "late");
  for (int64_t s = 4; s < 9; ++s) job.Step(s);
  for (int k = 0; k < 2; ++k) job.shard(k)->FlushCheckpoints();
  std::vector<int64_t> steps;
  for (const CheckpointSetSummary& set : ListCheckpointSets(JobDir(dir))) steps.push_back(set.step);
  EXPECT_EQ(steps, std::vector<int64_t>{5});
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(JobDir(dir));
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 5);
}

TEST_P(ShardCheckpoint, FinalCheckpointAtShutdownResumesInOneShardBitIdentical) {
  const Reference ref = Uninterrupted(GetParam());
  const std::string dir = TempDir();
  {
    Job job(Config(2, dir, 0, GetParam()));
    ASSERT_TRUE(job.status().ok()) << job.status();
    job.Declare();
    for (int64_t s = 0; s < 6; ++s) job.Step(s);
    for (int k = 0; k < 2; ++k) {
      job.shard(k)->Shutdown();
      absl::Status st = job.shard(k)->WriteFinalCheckpoint();
      ASSERT_TRUE(st.ok()) << st;
    }
  }
  Job job(Config(1, dir, 0, GetParam()));
  ASSERT_TRUE(job.status().ok()) << job.status();
  EXPECT_EQ(job.shard(0)->restored_step(), 5);
  EXPECT_NE(job.shard(0)->restored_from().find("final-of-2"), std::string::npos);
  job.Declare();
  EXPECT_EQ(job.Values(), ref.at5);
  // A worker that did not see step 5's reply resends it: the cached result, not a new step.
  job.Step(5);
  EXPECT_EQ(job.Values(), ref.at5);
  for (int64_t s = 6; s < 10; ++s) job.Step(s);
  EXPECT_EQ(job.Values(), ref.at9);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ShardCheckpoint, ::testing::Values("momentum", "adam"));

TEST(ShardCheckpointErrors, MismatchedCheckpointIsRefusedNamingTheProblem) {
  const std::string dir = TempDir();
  {
    Job job(Config(2, dir, 0));
    job.Declare();
    job.Step(0);
    for (int k = 0; k < 2; ++k) ASSERT_TRUE(job.shard(k)->WriteFinalCheckpoint().ok());
  }
  Job other_chunks(Config(2, dir, 0, "adam", "128"));
  EXPECT_EQ(other_chunks.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other_chunks.status().message().find("chunk_bytes 128"), std::string::npos)
      << other_chunks.status();
  Job other_optimizer(Config(2, dir, 0, "momentum"));
  ASSERT_TRUE(other_optimizer.status().ok());  // the checkpoint's optimizer wins for its tensors
  // A set of another job, put into this job's directory by hand, is refused by name.
  const std::string other_dir = dir + "/other";
  ASSERT_EQ(std::rename(JobDir(dir).c_str(), other_dir.c_str()), 0);
  proto::ClusterConfig c = Config(2, dir, 0);
  c.set_job("other");
  absl::StatusOr<std::unique_ptr<ShardService>> s = ShardService::Create(c, ShardOptions{});
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("job 'j'"), std::string::npos) << s.status();
}

// Jobs that share a checkpoint volume keep their sets apart: a new job starts empty and
// never touches the last one's sets (it used to find them and refuse to start).
TEST(ShardCheckpointErrors, ANewJobOnTheSameVolumeStartsEmpty) {
  const std::string dir = TempDir();
  {
    Job job(Config(1, dir, 0));
    job.Declare();
    job.Step(0);
    ASSERT_TRUE(job.shard(0)->WriteFinalCheckpoint().ok());
  }
  proto::ClusterConfig c = Config(1, dir, 0);
  c.set_job("next");
  absl::StatusOr<std::unique_ptr<ShardService>> next = ShardService::Create(c, ShardOptions{});
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)->restored_step(), -1);
  ASSERT_TRUE((*next)->WriteFinalCheckpoint().ok());
  EXPECT_EQ(ListCheckpointSets(dir + "/next").size(), 1u);
  absl::StatusOr<LoadedCheckpoint> first = LoadLatestCheckpoint(JobDir(dir));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->job, "j");
  EXPECT_EQ(first->step, 0);
}

TEST(ShardCheckpointErrors, ADirectoryThatCannotHoldCheckpointsRefusesToStart) {
  // A file where the directory should be: listing it used to read as "no checkpoint", the
  // shard started empty and every checkpoint after failed only in the log.
  const std::string file = absl::StrCat(TempDir(), "/not_a_dir");
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  for (const std::string& dir : {file, absl::StrCat(file, "/below")}) {
    Job job(Config(1, dir, 0));
    EXPECT_FALSE(job.status().ok()) << dir;
    EXPECT_NE(job.status().message().find("Not a directory"), std::string::npos) << job.status();
    const auto [text, usable] = DescribeCheckpoints(dir);
    EXPECT_FALSE(usable);
    EXPECT_NE(text.find("cannot read checkpoint directory"), std::string::npos) << text;
  }
  // A directory not there yet is made at start.
  const std::string fresh = absl::StrCat(TempDir(), "/made/at/start");
  Job job(Config(1, fresh, 0));
  ASSERT_TRUE(job.status().ok()) << job.status();
  struct stat st;
  EXPECT_EQ(stat(fresh.c_str(), &st), 0);
}

// A new directory holding the final checkpoint of `shards` shards after one step.
std::string FinalCheckpointOfOneStep(int shards) {
  const std::string dir = TempDir();
  Job job(Config(shards, dir, 0));
  job.Declare();
  job.Step(0);
  for (int k = 0; k < shards; ++k) EXPECT_TRUE(job.shard(k)->WriteFinalCheckpoint().ok());
  return dir;
}

TEST(ShardCheckpointErrors, DamagedOnlyCheckpointRefusesToStart) {
  const std::string dir = FinalCheckpointOfOneStep(1);
  const std::string manifest = absl::StrCat(JobDir(dir), "/final-of-1/shard-0-of-1.manifest");
  ASSERT_TRUE(WriteFileAtomically(manifest, "not a manifest\n").ok());
  Job job(Config(1, dir, 0));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(job.status().message().find(manifest), std::string::npos) << job.status();
}

TEST(ShardCheckpointErrors, AFirstCheckpointThatNoShardFinishedIsPassedOver) {
  // A shard killed while writing its first checkpoint leaves a set with data but no
  // manifest: nothing was committed, so the restart starts empty (it refused to start,
  // and kept refusing, until someone removed the set by hand).
  const std::string dir = FinalCheckpointOfOneStep(1);
  const std::string manifest = absl::StrCat(JobDir(dir), "/final-of-1/shard-0-of-1.manifest");
  ASSERT_EQ(std::remove(manifest.c_str()), 0);
  Job job(Config(1, dir, 0));
  ASSERT_TRUE(job.status().ok()) << job.status();
  EXPECT_EQ(job.shard(0)->restored_step(), -1);  // nothing restored
  proto::StatsResponse stats;
  job.shard(0)->Stats(&stats);
  EXPECT_EQ(stats.tensors(), 0u);
  // A set that one shard of two committed is damage, not an interrupted start.
  const std::string two = FinalCheckpointOfOneStep(2);
  ASSERT_EQ(std::remove(absl::StrCat(JobDir(two), "/final-of-2/shard-1-of-2.manifest").c_str()), 0);
  Job damaged(Config(2, two, 0));
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
}

// A chunk that completed step 2^62 - 1, the last step a push may name, is at step 2^62:
// its checkpoint restores (the restore refused it, and the shard would not start).
TEST(ShardCheckpointErrors, AChunkAtTheLastStepRestores) {
  const std::string dir = TempDir();
  {
    Job job(Config(1, dir, 0));
    job.Declare();
    job.Step(kMaxStep - 1);
    ASSERT_TRUE(job.shard(0)->WriteFinalCheckpoint().ok());
  }
  Job job(Config(1, dir, 0));
  ASSERT_TRUE(job.status().ok()) << job.status();
  EXPECT_EQ(job.shard(0)->restored_step(), kMaxStep - 1);
}

// A newer set whose checksums hold but whose states cannot be restored (here a chunk whose
// completed step and step in progress disagree) is skipped for the older one, as a damaged
// set is: it used to stop the shard, at every restart, until someone removed it by hand.
TEST(ShardCheckpointErrors, ASetWhoseStatesCannotBeRestoredIsSkippedForAnOlderOne) {
  const std::string dir = FinalCheckpointOfOneStep(1);
  absl::StatusOr<LoadedCheckpoint> good = LoadLatestCheckpoint(JobDir(dir));
  ASSERT_TRUE(good.ok()) << good.status();
  server::ShardCheckpoint forged;
  forged.job = "j";
  forged.step = 100;
  forged.declarations = good->declarations;
  forged.chunks = good->chunks;
  forged.chunks.back().set_current_step(forged.chunks.back().completed_step() + 3);
  ASSERT_TRUE(WriteShardCheckpoint(JobDir(dir), std::move(forged), /*keep=*/5).ok());
  Job job(Config(1, dir, 0));
  ASSERT_TRUE(job.status().ok()) << job.status();
  EXPECT_EQ(job.shard(0)->restored_step(), 0);
  EXPECT_TRUE(absl::EndsWith(job.shard(0)->restored_from(), "/final-of-1"))
      << job.shard(0)->restored_from();
}

// Sets of this job left in the root by shards before per-job directories: the shard does
// not start empty over them; it names the command that moves them, and restores after it.
TEST(ShardCheckpointErrors, SetsInTheOldLayoutAreNamedWithTheMoveNotDropped) {
  const std::string dir = FinalCheckpointOfOneStep(1);
  ASSERT_EQ(std::rename(absl::StrCat(JobDir(dir), "/final-of-1").c_str(),
                        absl::StrCat(dir, "/final-of-1").c_str()),
            0);
  Job refused(Config(1, dir, 0));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find(absl::StrCat("mv ", dir, "/step-* ", dir, "/final-* ",
                                                         JobDir(dir), "/")),
            std::string::npos)
      << refused.status();
  ASSERT_EQ(std::rename(absl::StrCat(dir, "/final-of-1").c_str(),
                        absl::StrCat(JobDir(dir), "/final-of-1").c_str()),
            0);
  Job job(Config(1, dir, 0));
  ASSERT_TRUE(job.status().ok()) << job.status();
  EXPECT_EQ(job.shard(0)->restored_step(), 0);
}

}  // namespace
}  // namespace gcomp::server
