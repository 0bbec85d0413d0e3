#include "cluster/shard_map.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp::cluster {
namespace {

TEST(ChunkLayout, CutsWholeElements) {
  ChunkLayout l(10, 4, 12);
  EXPECT_EQ(l.chunk_elements, 3u);
  EXPECT_EQ(l.num_chunks, 4u);
  EXPECT_EQ(l.size(3), 1u);
  EXPECT_EQ(ChunkLayout(1, 4, 1).num_chunks, 1u);  // at least one element per chunk
}

TEST(ShardMap, IsDeterministic) {
  ChunkLayout l(1000000, 4, 4096);
  EXPECT_EQ(ShardMap(3, 1).Assign("w", l), ShardMap(3, 1).Assign("w", l));
}

TEST(ShardMap, BalancedByBytes) {
  for (uint32_t s = 1; s <= 8; ++s) {
    ChunkLayout l(1 << 20, 4, 4096);  // 1024 chunks
    std::vector<uint32_t> owner = ShardMap(s, 1).Assign("layer.weight", l);
    std::vector<size_t> load(s, 0);
    for (size_t c = 0; c < owner.size(); ++c) load[owner[c]] += l.size(c);
    const double fair = static_cast<double>(l.elements) / s;
    for (size_t k = 0; k < s; ++k) {
      EXPECT_LE(load[k], (1 + ShardMap::kSlack) * fair + l.chunk_elements) << s;
      EXPECT_GE(load[k], 0.6 * fair) << "shards " << s << " shard " << k;
    }
  }
}

TEST(ShardMap, AddingAShardMovesFewChunks) {
  ChunkLayout l(1 << 20, 4, 4096);
  for (uint32_t s = 2; s <= 7; ++s) {
    std::vector<uint32_t> before = ShardMap(s, 1).Assign("w", l);
    std::vector<uint32_t> after = ShardMap(s + 1, 2).Assign("w", l);
    size_t moved = 0;
    for (size_t c = 0; c < before.size(); ++c) moved += before[c] != after[c];
    const double fraction = static_cast<double>(moved) / before.size();
    // Ideal is 1/(s+1); modulo hashing would move s/(s+1).
    EXPECT_LE(fraction, 1.0 / (s + 1) + 0.15) << s << " -> " << s + 1;
  }
}

TEST(ShardMap, LiveReplicasStartWithTheOwnerAndAreDistinct) {
  ChunkLayout l(1 << 16, 4, 4096);  // 64 chunks
  const ShardMap map(4, 1);
  const std::vector<uint32_t> owner = map.Assign("w", l);
  const std::vector<uint32_t> live = map.LiveReplicas("w", l, 3, {});
  ASSERT_EQ(live.size(), 3 * l.num_chunks);
  std::vector<size_t> backups(4, 0);
  for (size_t c = 0; c < l.num_chunks; ++c) {
    EXPECT_EQ(live[3 * c], owner[c]);
    EXPECT_NE(live[3 * c + 1], live[3 * c]);
    EXPECT_NE(live[3 * c + 2], live[3 * c]);
    EXPECT_NE(live[3 * c + 2], live[3 * c + 1]);
    ++backups[live[3 * c + 1]];
  }
  // Backups spread over the shards, not all on one.
  for (size_t k = 0; k < 4; ++k) EXPECT_GT(backups[k], 0u) << k;
  EXPECT_EQ(map.LiveReplicas("w", l, 1, {}), owner);
}

TEST(ShardMap, ADownShardsChunksFallToTheirFirstBackup) {
  ChunkLayout l(1 << 16, 4, 4096);
  const ShardMap map(3, 1);
  const std::vector<uint32_t> before = map.LiveReplicas("w", l, 2, {});
  const std::vector<uint32_t> after = map.LiveReplicas("w", l, 2, {false, true, false});
  for (size_t c = 0; c < l.num_chunks; ++c) {
    if (before[2 * c] == 1) {
      EXPECT_EQ(after[2 * c], before[2 * c + 1]) << c;  // the backup takes over
    } else {
      EXPECT_EQ(after[2 * c], before[2 * c]) << c;  // nothing else moves
    }
    EXPECT_NE(after[2 * c], 1u);
    EXPECT_NE(after[2 * c + 1], 1u);
  }
  // Two of three down: one live shard, the second replica missing.
  const std::vector<uint32_t> one = map.LiveReplicas("w", l, 2, {true, true, false});
  for (size_t c = 0; c < l.num_chunks; ++c) {
    EXPECT_EQ(one[2 * c], 2u);
    EXPECT_EQ(one[2 * c + 1], ShardMap::kNone);
  }
}

TEST(ShardMap, AJoiningShardBacksItsChunksUpButOwnsNone) {
  ChunkLayout l(1 << 16, 4, 4096);
  const ShardMap map(3, 1);
  const std::vector<uint32_t> full = map.LiveReplicas("w", l, 2, {});
  const std::vector<uint32_t> joining = map.LiveReplicas("w", l, 2, {}, {false, true, false});
  for (size_t c = 0; c < l.num_chunks; ++c) {
    EXPECT_NE(joining[2 * c], 1u) << c;
    if (full[2 * c] == 1) {
      // Its own chunks: the backup owns them meanwhile, the joining shard backs them up.
      EXPECT_EQ(joining[2 * c], full[2 * c + 1]);
      EXPECT_EQ(joining[2 * c + 1], 1u);
    } else {
      EXPECT_EQ(joining[2 * c], full[2 * c]);
      EXPECT_EQ(joining[2 * c + 1], full[2 * c + 1]);
    }
  }
}

}  // namespace
}  // namespace gcomp::cluster
