#include "server/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

std::string TempDir() {
  std::string tmpl = absl::StrCat(::testing::TempDir(), "/ckptXXXXXX");
  char* d = ::mkdtemp(tmpl.data());
  EXPECT_NE(d, nullptr);
  return tmpl;
}

// Shard `shard` of `shards`: tensor "w" of 10 elements in chunks of 4 bytes (10 chunks),
// chunk c owned by shard c % shards, its state a marker of (step, c).
ShardCheckpoint Shard(uint32_t shard, uint32_t shards, int64_t step) {
  ShardCheckpoint c;
  c.job = "j";
  c.step = step;
  c.shard = shard;
  c.shards = shards;
  proto::TensorDeclaration& d = c.declarations.emplace_back();
  d.set_job("j");
  d.set_key("w");
  d.set_dtype(proto::DTYPE_F32);
  d.set_elements(10);
  d.set_chunk_bytes(4);
  d.mutable_optimizer()->set_name("sgd");
  for (uint32_t chunk = shard; chunk < 10; chunk += shards) {
    proto::ChunkState& s = c.chunks.emplace_back();
    s.set_job("j");
    s.set_key("w");
    s.set_chunk(chunk);
    s.set_elements(1);
    s.set_started(true);
    s.set_current_step(step + 1);
    s.set_completed_step(step);
    s.set_optimizer_steps(step * 100 + chunk);
  }
  return c;
}

void WriteSet(const std::string& dir, uint32_t shards, int64_t step, uint32_t keep = 10) {
  for (uint32_t k = 0; k < shards; ++k) {
    absl::StatusOr<uint64_t> bytes = WriteShardCheckpoint(dir, Shard(k, shards, step), keep);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
  }
}

std::string DataFile(const std::string& set_dir, uint32_t shard, uint32_t shards) {
  std::string manifest = *ReadFile(absl::StrCat(set_dir, "/shard-", shard, "-of-", shards, ".manifest"));
  size_t at = manifest.find("\nfile ") + 6;
  return absl::StrCat(set_dir, "/", manifest.substr(at, manifest.find(' ', at) - at));
}

TEST(CheckpointFile, RoundTrip) {
  ShardCheckpoint c = Shard(1, 3, 5);
  std::vector<proto::CheckpointRecord> records;
  *records.emplace_back().mutable_declaration() = c.declarations[0];
  for (const auto& s : c.chunks) *records.emplace_back().mutable_chunk() = s;
  const std::string bytes = SerializeCheckpointFile(records);
  absl::StatusOr<std::vector<proto::CheckpointRecord>> back = ParseCheckpointFile(bytes, "f");
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), records.size());
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ((*back)[i].SerializeAsString(), records[i].SerializeAsString());
  }
}

TEST(CheckpointFile, EveryTruncationAndEveryByteFlipIsDataLoss) {
  ShardCheckpoint c = Shard(0, 2, 5);
  std::vector<proto::CheckpointRecord> records;
  *records.emplace_back().mutable_declaration() = c.declarations[0];
  for (const auto& s : c.chunks) *records.emplace_back().mutable_chunk() = s;
  const std::string bytes = SerializeCheckpointFile(records);
  for (size_t len = 0; len < bytes.size(); ++len) {
    absl::StatusOr<std::vector<proto::CheckpointRecord>> r =
        ParseCheckpointFile(bytes.substr(0, len), "/x/shard-0.ckpt");
    ASSERT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << len;
    EXPECT_NE(r.status().message().find("/x/shard-0.ckpt"), std::string::npos);
  }
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string damaged = bytes;
    damaged[i] ^= 0x01;
    EXPECT_EQ(ParseCheckpointFile(damaged, "f").status().code(), absl::StatusCode::kDataLoss) << i;
  }
}

TEST(Checkpoint, LoadsTheNewestCompleteSetMergedOverShards) {
  const std::string dir = TempDir();
  WriteSet(dir, 2, 5);
  WriteSet(dir, 2, 11);
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 11);
  EXPECT_EQ(c->shards, 2u);
  EXPECT_EQ(c->job, "j");
  EXPECT_TRUE(c->skipped.empty());
  ASSERT_EQ(c->declarations.size(), 1u);
  ASSERT_EQ(c->chunks.size(), 10u);
  for (const proto::ChunkState& s : c->chunks) EXPECT_EQ(s.optimizer_steps(), 1100 + s.chunk());
}

// A restoring shard reads every record but keeps only the chunks it asks for; the checks
// of the whole set still hold for the chunks it drops.
TEST(Checkpoint, KeepHoldsOnlyTheChunksAskedForAndStillChecksTheRest) {
  const std::string dir = TempDir();
  WriteSet(dir, 2, 5);
  WriteSet(dir, 2, 11);
  int sets_begun = 0, chunks_seen = 0;
  LoadOptions o;
  o.begin_set = [&] { ++sets_begun; };
  o.keep = [&](const proto::TensorDeclaration& d, proto::ChunkState* c) -> absl::StatusOr<bool> {
    EXPECT_EQ(d.key(), c->key());
    ++chunks_seen;
    return c->chunk() % 3 == 0;
  };
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 11);
  EXPECT_EQ(sets_begun, 1);
  EXPECT_EQ(chunks_seen, 10);
  ASSERT_EQ(c->chunks.size(), 4u);  // chunks 0, 3, 6, 9
  for (const proto::ChunkState& s : c->chunks) EXPECT_EQ(s.chunk() % 3, 0u);
  EXPECT_EQ(c->declarations.size(), 1u);

  // The newest set misses a chunk that nobody keeps: still damage, and the older set is
  // read in its place (begun anew).
  const std::string dir2 = TempDir();
  WriteSet(dir2, 2, 5);
  ShardCheckpoint missing = Shard(1, 2, 11);
  missing.chunks.pop_back();  // chunk 9
  ASSERT_TRUE(WriteShardCheckpoint(dir2, Shard(0, 2, 11), 10).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir2, missing, 10).ok());
  sets_begun = 0;
  o.keep = [](const proto::TensorDeclaration&, proto::ChunkState*) -> absl::StatusOr<bool> {
    return false;
  };
  c = LoadLatestCheckpoint(dir2, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 5);
  EXPECT_EQ(sets_begun, 2);
  EXPECT_TRUE(c->chunks.empty());
  ASSERT_EQ(c->skipped.size(), 1u);
  EXPECT_NE(c->skipped[0].find("has 9 of its 10 chunks"), std::string::npos) << c->skipped[0];

  // An error from `keep` skips the set like damage.
  o.keep = [](const proto::TensorDeclaration&, proto::ChunkState* c) -> absl::StatusOr<bool> {
    if (c->optimizer_steps() >= 1100) return absl::DataLossError("state cannot be restored");
    return true;
  };
  c = LoadLatestCheckpoint(dir, o);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 5);
  EXPECT_EQ(c->chunks.size(), 10u);
}

TEST(Checkpoint, EmptyDirectoryIsNotFound) {
  EXPECT_EQ(LoadLatestCheckpoint(TempDir()).status().code(), absl::StatusCode::kNotFound);
}

TEST(Checkpoint, HalfWrittenSetIsSkipped) {
  const std::string dir = TempDir();
  WriteSet(dir, 2, 5);
  ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(0, 2, 11), 10).ok());  // shard 1 never wrote
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 5);
  ASSERT_EQ(c->skipped.size(), 1u);
  EXPECT_NE(c->skipped[0].find("shard-1-of-2.manifest is missing"), std::string::npos) << c->skipped[0];
}

// A shard that owns no chunk completes no step and writes no periodic manifest: a set is
// complete without it when a shard that wrote one names it idle, and is pruned as complete.
TEST(Checkpoint, SetWithoutTheManifestOfAnIdleShardIsComplete) {
  const std::string dir = TempDir();
  // Every chunk on shard 1 of 2 (shard 0 owns none).
  auto all_on_one = [](int64_t step, std::vector<uint32_t> idle) {
    ShardCheckpoint c = Shard(0, 1, step);
    c.shard = 1;
    c.shards = 2;
    c.idle_shards = std::move(idle);
    return c;
  };
  for (int64_t step : {2, 5, 8})
    ASSERT_TRUE(WriteShardCheckpoint(dir, all_on_one(step, {0}), 2).ok());
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 8);
  EXPECT_TRUE(c->skipped.empty());
  EXPECT_EQ(c->chunks.size(), 10u);
  struct stat st;
  EXPECT_NE(::stat(absl::StrCat(dir, "/", CheckpointSetName(false, 2, 2)).c_str(), &st), 0)
      << "keep: 2 prunes sets of idle shards too";
  for (const CheckpointSetSummary& set : ListCheckpointSets(dir))
    EXPECT_EQ(set.problem, "") << set.path;

  // Without the note the same set is incomplete, and the older one is used.
  ASSERT_TRUE(WriteShardCheckpoint(dir, all_on_one(11, {}), 10).ok());
  c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 8);
  ASSERT_EQ(c->skipped.size(), 1u);
  EXPECT_NE(c->skipped[0].find("shard-0-of-2.manifest is missing"), std::string::npos)
      << c->skipped[0];

  // A shard named idle that did own chunks: the gap is found by the chunk count.
  ShardCheckpoint half = Shard(1, 2, 14);
  half.idle_shards = {0};
  ASSERT_TRUE(WriteShardCheckpoint(dir, half, 10).ok());
  c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 8);
  ASSERT_EQ(c->skipped.size(), 2u);
  EXPECT_NE(c->skipped[0].find("'w' has 5 of its 10 chunks"), std::string::npos) << c->skipped[0];
}

TEST(Checkpoint, ManifestWithBadIdleShardsIsDamage) {
  for (std::vector<uint32_t> idle : std::vector<std::vector<uint32_t>>{{1}, {2}, {0, 0}}) {
    const std::string dir = TempDir();
    WriteSet(dir, 2, 5);
    ShardCheckpoint c = Shard(1, 2, 8);
    c.idle_shards = idle;  // its own index, out of range, repeated
    ASSERT_TRUE(WriteShardCheckpoint(dir, c, 10).ok());
    ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(0, 2, 8), 10).ok());
    absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(dir);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->step, 5);
    ASSERT_EQ(loaded->skipped.size(), 1u);
    EXPECT_NE(loaded->skipped[0].find("idle_shards must list other shards"), std::string::npos)
        << loaded->skipped[0];
  }
}

enum class Damage {
  kTruncate,
  kFlipByte,
  kDeleteManifest,
  kDeleteData,
  kFlipManifest,
  kManifestIsADirectory,
  kManifestIsASymlinkLoop,
  kDataGrew,
};

class DamagedCheckpoint : public ::testing::TestWithParam<Damage> {};

TEST_P(DamagedCheckpoint, FallsBackToThePreviousSetNamingTheProblem) {
  const std::string dir = TempDir();
  WriteSet(dir, 2, 5);
  WriteSet(dir, 2, 11);
  const std::string set = absl::StrCat(dir, "/", CheckpointSetName(false, 11, 2));
  const std::string data = DataFile(set, 1, 2);
  const std::string manifest = absl::StrCat(set, "/shard-1-of-2.manifest");
  std::string expect;
  switch (GetParam()) {
    case Damage::kTruncate:
      ASSERT_EQ(::truncate(data.c_str(), 40), 0);
      expect = data;
      break;
    case Damage::kFlipByte: {
      std::string bytes = *ReadFile(data);
      bytes[bytes.size() / 2] ^= 0x20;
      std::ofstream(data, std::ios::binary | std::ios::trunc) << bytes;
      expect = data;
      break;
    }
    case Damage::kDeleteManifest:
      ASSERT_EQ(std::remove(manifest.c_str()), 0);
      expect = manifest;
      break;
    case Damage::kDeleteData:
      ASSERT_EQ(std::remove(data.c_str()), 0);
      expect = data;
      break;
    case Damage::kManifestIsADirectory:  // unreadable: damage, not a manifest to come
      ASSERT_EQ(std::remove(manifest.c_str()), 0);
      ASSERT_EQ(::mkdir(manifest.c_str(), 0755), 0);
      expect = manifest;
      break;
    case Damage::kManifestIsASymlinkLoop:
      ASSERT_EQ(std::remove(manifest.c_str()), 0);
      ASSERT_EQ(::symlink(manifest.c_str(), manifest.c_str()), 0);
      expect = manifest;
      break;
    case Damage::kDataGrew: {  // read no further than the manifest's size (+1)
      std::ofstream(data, std::ios::binary | std::ios::app) << std::string(1 << 20, 'x');
      expect = data;
      break;
    }
    case Damage::kFlipManifest: {
      std::string text = *ReadFile(manifest);
      text[text.find("epoch 1") + 6] = '2';
      std::ofstream(manifest, std::ios::trunc) << text;
      expect = manifest;
      break;
    }
  }
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 5);
  EXPECT_EQ(c->chunks.size(), 10u);
  ASSERT_EQ(c->skipped.size(), 1u);
  EXPECT_NE(c->skipped[0].find(expect), std::string::npos) << c->skipped[0];

  // With the older set damaged too, nothing loads and the error names both problems.
  const std::string old_set = absl::StrCat(dir, "/", CheckpointSetName(false, 5, 2));
  ASSERT_EQ(::truncate(DataFile(old_set, 0, 2).c_str(), 10), 0);
  c = LoadLatestCheckpoint(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find(expect), std::string::npos) << c.status();
  EXPECT_NE(c.status().message().find(old_set), std::string::npos) << c.status();
}

INSTANTIATE_TEST_SUITE_P(All, DamagedCheckpoint,
                         ::testing::Values(Damage::kTruncate, Damage::kFlipByte,
                                           Damage::kDeleteManifest, Damage::kDeleteData,
                                           Damage::kFlipManifest, Damage::kManifestIsADirectory,
                                           Damage::kManifestIsASymlinkLoop, Damage::kDataGrew));

// A set whose only manifest cannot be read (here a directory in its place) is damage,
// skipped with its problem named; it used to pass as a set no shard had finished writing,
// skipped without a word.
TEST(Checkpoint, AnUnreadableManifestIsDamageNotASetInProgress) {
  const std::string dir = TempDir();
  WriteSet(dir, 1, 5);
  const std::string final_dir = absl::StrCat(dir, "/", CheckpointSetName(true, 0, 1));
  ASSERT_EQ(::mkdir(final_dir.c_str(), 0755), 0);
  const std::string manifest = absl::StrCat(final_dir, "/shard-0-of-1.manifest");
  ASSERT_EQ(::mkdir(manifest.c_str(), 0755), 0);
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 5);
  ASSERT_EQ(c->skipped.size(), 1u);
  EXPECT_TRUE(absl::StrContains(c->skipped[0], manifest + " cannot be read")) << c->skipped[0];
}

// Names of sets no config can write (a stray folder "final-of-4000000000") are passed over
// at once: every listing used to try to read a manifest for each of 4e9 shards.
TEST(Checkpoint, SetNamesWithImpossibleShardCountsArePassedOver) {
  const std::string dir = TempDir();
  WriteSet(dir, 2, 5);
  for (const char* name : {"final-of-4000000000", "step-000000000009-of-4097",
                           "step-000000000009-of-4294967295", "step--1-of-2"}) {
    ASSERT_EQ(::mkdir(absl::StrCat(dir, "/", name).c_str(), 0755), 0) << name;
  }
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->step, 5);
  EXPECT_EQ(ListCheckpointSets(dir).size(), 1u);
}

TEST(Checkpoint, MissingChunkIsDataLoss) {
  const std::string dir = TempDir();
  ShardCheckpoint a = Shard(0, 2, 5);
  a.chunks.pop_back();
  ASSERT_TRUE(WriteShardCheckpoint(dir, a, 10).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(1, 2, 5), 10).ok());
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(c.status().message().find("'w' has 9 of its 10 chunks"), std::string::npos) << c.status();
}

TEST(Checkpoint, KeepsTheNewestCompleteSets) {
  const std::string dir = TempDir();
  for (int64_t step : {2, 5, 8, 11}) WriteSet(dir, 2, step, /*keep=*/2);
  for (int64_t step : {2, 5}) {
    struct stat st;
    EXPECT_NE(::stat(absl::StrCat(dir, "/", CheckpointSetName(false, step, 2)).c_str(), &st), 0) << step;
  }
  for (int64_t step : {8, 11}) {
    struct stat st;
    EXPECT_EQ(::stat(absl::StrCat(dir, "/", CheckpointSetName(false, step, 2)).c_str(), &st), 0) << step;
  }
}

// Shard 1 of 2 never writes (down, or its sets skipped): every periodic set stays
// incomplete. Shard 0 keeps the newest keep + 1 of them, not one more per boundary.
TEST(Checkpoint, IncompleteSetsAreBoundedToo) {
  const std::string dir = TempDir();
  WriteSet(dir, 2, 1, /*keep=*/2);  // one complete set, kept
  for (int64_t step = 2; step < 30; ++step) {
    ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(0, 2, step), /*keep=*/2).ok());
  }
  std::vector<int64_t> left;
  for (const CheckpointSetSummary& set : ListCheckpointSets(dir)) left.push_back(set.step);
  EXPECT_EQ(left, (std::vector<int64_t>{29, 28, 27, 1}));
  absl::StatusOr<LoadedCheckpoint> loaded = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->step, 1);
}

// A shard one or two sets behind is still writing; one that missed three in a row is named,
// to the shards that write and in the operators' listing, until a set is complete again.
TEST(Checkpoint, AShardThatMissedThreeSetsInARowIsNamed) {
  const std::string dir = TempDir();
  WriteSet(dir, 3, 9);
  EXPECT_EQ(StalledCheckpointShards(dir, 3), "");
  for (int64_t step : {19, 29}) {
    ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(0, 3, step), /*keep=*/2).ok());
    ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(2, 3, step), /*keep=*/2).ok());
  }
  ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(2, 3, 19), /*keep=*/2).ok());
  EXPECT_EQ(StalledCheckpointShards(dir, 3), "") << "two sets behind: not yet";
  ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(0, 3, 39), /*keep=*/2).ok());
  const std::string stalled = StalledCheckpointShards(dir, 3);
  EXPECT_TRUE(absl::StrContains(stalled,
                                "shard 1 of 3 wrote none of the last 3 periodic "
                                "checkpoint sets (steps 19 to 39)"))
      << stalled;
  EXPECT_TRUE(absl::StrContains(stalled, "keys no longer pushed")) << stalled;
  // Shard 2 missed only step 39: it is behind, not named.
  EXPECT_FALSE(absl::StrContains(stalled, "2 of 3")) << stalled;
  EXPECT_EQ(StalledCheckpointShards(dir, 2), "") << "another shard count's sets";
  const auto [text, usable] = DescribeCheckpoints(dir);
  EXPECT_TRUE(usable);
  EXPECT_TRUE(absl::StrContains(text, "warning: shard 1 of 3 wrote none")) << text;
  // Shards 1 and 2 catch up: step 39 is complete, and nothing is named.
  ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(1, 3, 39), /*keep=*/2).ok());
  ASSERT_TRUE(WriteShardCheckpoint(dir, Shard(2, 3, 39), /*keep=*/2).ok());
  EXPECT_EQ(StalledCheckpointShards(dir, 3), "");
  EXPECT_FALSE(absl::StrContains(DescribeCheckpoints(dir).first, "warning")) << text;
}

// Shard 1 stops alone and writes its final set while shard 0 trains on and cleans up after
// each periodic set: a final set no shard has finished is not shard 0's to delete (it was,
// and shard 1's rename then failed).
TEST(Checkpoint, AFinalSetBeingWrittenIsNotDeletedByAnotherShard) {
  const std::string dir = TempDir();
  const std::string final_dir = absl::StrCat(dir, "/", CheckpointSetName(true, 0, 2));
  ASSERT_EQ(::mkdir(final_dir.c_str(), 0755), 0);
  {
    std::ofstream partial(absl::StrCat(final_dir, "/shard-1-of-2-0123456789abcdef.ckpt.tmp7"));
    partial << "half written";
  }
  for (int64_t step : {2, 5, 8}) WriteSet(dir, 2, step, /*keep=*/1);
  struct stat st;
  EXPECT_EQ(::stat(final_dir.c_str(), &st), 0);
  ShardCheckpoint last = Shard(1, 2, 8);
  last.final = true;
  ASSERT_TRUE(WriteShardCheckpoint(dir, std::move(last), /*keep=*/1).ok());
  // Now written (and incomplete: shard 0 wrote no final set), it is an ordinary set again.
  WriteSet(dir, 2, 11, /*keep=*/1);
  EXPECT_NE(::stat(final_dir.c_str(), &st), 0);
}

TEST(Checkpoint, FinalSetIsRewrittenInPlaceAndWinsATie) {
  const std::string dir = TempDir();
  WriteSet(dir, 2, 5);
  for (int round = 0; round < 2; ++round) {
    for (uint32_t k = 0; k < 2; ++k) {
      ShardCheckpoint c = Shard(k, 2, 5);
      c.final = true;
      for (proto::ChunkState& s : c.chunks) s.set_optimizer_steps(7000 + round);
      ASSERT_TRUE(WriteShardCheckpoint(dir, c, 10).ok());
    }
  }
  absl::StatusOr<LoadedCheckpoint> c = LoadLatestCheckpoint(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->final);
  EXPECT_EQ(c->step, 5);
  for (const proto::ChunkState& s : c->chunks) EXPECT_EQ(s.optimizer_steps(), 7001);
  // One data file per shard: the rewrite removed the first round's.
  int files = 0;
  for (uint32_t k = 0; k < 2; ++k) {
    std::ifstream in(DataFile(c->path, k, 2));
    files += in.good();
  }
  EXPECT_EQ(files, 2);
}

}  // namespace
}  // namespace gcomp::server
