// Which shard owns which chunk of a tensor.
//
// Deterministic (same inputs => same map, on every worker and shard), balanced by bytes,
// and stable: going from S to S+1 shards moves about 1/(S+1) of the bytes, not most of
// them. The map is bounded-load rendezvous hashing: each chunk ranks the shards by a hash
// of (key, chunk, shard) and takes the best-ranked shard whose load stays within
// (1 + kSlack) times the fair share. The epoch names the layout; every call carries it.
// Thread-safe (immutable).
#ifndef GCOMP_CLUSTER_SHARD_MAP_H_
#define GCOMP_CLUSTER_SHARD_MAP_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace gcomp::cluster {

// The most elements a tensor may have (a shard refuses larger declarations; the worker
// Client checks before it lays the chunks out).
inline constexpr uint64_t kMaxTensorElements = uint64_t{1} << 36;
// InvalidArgument naming `key` unless elements is in [1, kMaxTensorElements].
absl::Status CheckTensorElements(absl::string_view key, uint64_t elements);

// How a tensor of `elements` elements of `element_bytes` bytes is cut into chunks of
// chunk_bytes (rounded down to whole elements, at least one element each).
struct ChunkLayout {
  size_t elements = 0;
  size_t chunk_elements = 1;
  size_t num_chunks = 0;

  ChunkLayout() = default;
  ChunkLayout(size_t elements, size_t element_bytes, size_t chunk_bytes);
  size_t begin(size_t chunk) const { return chunk * chunk_elements; }
  size_t size(size_t chunk) const;
};

class ShardMap {
 public:
  static constexpr double kSlack = 0.25;

  // Requires num_shards >= 1.
  ShardMap(uint32_t num_shards, uint64_t epoch);

  uint32_t num_shards() const { return num_shards_; }
  uint64_t epoch() const { return epoch_; }

  // The owner of every chunk of tensor `key` laid out as `layout`.
  std::vector<uint32_t> Assign(absl::string_view key, const ChunkLayout& layout) const;

  // Marks a missing replica in LiveReplicas.
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
  // Each chunk's live replica set: the first `replicas` shards not in `down` of its
  // ranking (Assign's owner first, then the rest in hash order), so that a down shard's
  // chunks fall to a known next shard and no other chunk moves. A `joining` shard (back
  // from a failover, catching up) keeps its place in the set but owns nothing: the first
  // shard of the ranking that is neither down nor joining is the owner. Chunk c's set is
  // [c * replicas, (c + 1) * replicas), owner first, padded with kNone when too few shards
  // are live (owner kNone: none may own it). `down` and `joining` have num_shards()
  // entries, or are empty (none).
  std::vector<uint32_t> LiveReplicas(absl::string_view key, const ChunkLayout& layout,
                                     uint32_t replicas, const std::vector<bool>& down,
                                     const std::vector<bool>& joining = {}) const;

 private:
  uint32_t num_shards_;
  uint64_t epoch_;
};

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_SHARD_MAP_H_
