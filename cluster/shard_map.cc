#include "cluster/shard_map.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "xxhash.h"

namespace gcomp::cluster {

absl::Status CheckTensorElements(absl::string_view key, uint64_t elements) {
  if (elements != 0 && elements <= kMaxTensorElements) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("tensor '", key, "': elements must be in [1, 2^36], got ", elements));
}

ChunkLayout::ChunkLayout(size_t elements, size_t element_bytes, size_t chunk_bytes)
    : elements(elements),
      chunk_elements(std::max<size_t>(1, chunk_bytes / element_bytes)),
      num_chunks((elements + chunk_elements - 1) / chunk_elements) {}

size_t ChunkLayout::size(size_t chunk) const {
  return std::min(chunk_elements, elements - begin(chunk));
}

ShardMap::ShardMap(uint32_t num_shards, uint64_t epoch) : num_shards_(num_shards), epoch_(epoch) {
  if (num_shards < 1) std::abort();  // programmer error: validated config has shards
}

namespace {

uint64_t KeyHash(absl::string_view key) { return XXH64(key.data(), key.size(), 0x6763); }

// The shards in chunk c's rendezvous order, best first.
void RankShards(uint64_t key_hash, size_t c, std::vector<std::pair<uint64_t, uint32_t>>* rank) {
  for (uint32_t s = 0; s < rank->size(); ++s) {
    uint64_t in[3] = {key_hash, c, s};
    (*rank)[s] = {XXH64(in, sizeof(in), 0), s};
  }
  std::sort(rank->begin(), rank->end(), std::greater<>());
}

}  // namespace

std::vector<uint32_t> ShardMap::Assign(absl::string_view key, const ChunkLayout& layout) const {
  std::vector<uint32_t> owner(layout.num_chunks, 0);
  if (num_shards_ == 1) return owner;
  const uint64_t key_hash = KeyHash(key);
  const double fair = static_cast<double>(layout.elements) / num_shards_;
  const double cap = std::max<double>((1.0 + kSlack) * fair, layout.chunk_elements);
  std::vector<double> load(num_shards_, 0.0);
  std::vector<std::pair<uint64_t, uint32_t>> rank(num_shards_);
  for (size_t c = 0; c < layout.num_chunks; ++c) {
    RankShards(key_hash, c, &rank);
    const double bytes = static_cast<double>(layout.size(c));
    uint32_t pick = rank[0].second;
    for (const auto& [score, s] : rank) {
      if (load[s] + bytes <= cap) {
        pick = s;
        break;
      }
    }
    owner[c] = pick;
    load[pick] += bytes;
  }
  return owner;
}

std::vector<uint32_t> ShardMap::LiveReplicas(absl::string_view key, const ChunkLayout& layout,
                                             uint32_t replicas, const std::vector<bool>& down,
                                             const std::vector<bool>& joining) const {
  const std::vector<uint32_t> owner = Assign(key, layout);
  auto is_down = [&down](uint32_t s) { return !down.empty() && down[s]; };
  auto is_joining = [&joining](uint32_t s) { return !joining.empty() && joining[s]; };
  std::vector<uint32_t> live(layout.num_chunks * replicas, kNone);
  const uint64_t key_hash = KeyHash(key);
  std::vector<std::pair<uint64_t, uint32_t>> rank(num_shards_);
  std::vector<uint32_t> candidates;
  for (size_t c = 0; c < layout.num_chunks; ++c) {
    uint32_t* set = &live[c * replicas];
    // The common case: the owner is up and the set is just the owner.
    if (replicas == 1 && !is_down(owner[c]) && !is_joining(owner[c])) {
      set[0] = owner[c];
      continue;
    }
    candidates.clear();
    if (!is_down(owner[c])) candidates.push_back(owner[c]);
    RankShards(key_hash, c, &rank);
    for (const auto& [score, s] : rank) {
      if (s != owner[c] && !is_down(s)) candidates.push_back(s);
    }
    // Owner: the first candidate not joining; then the others in ranking order.
    auto first = std::find_if(candidates.begin(), candidates.end(),
                              [&](uint32_t s) { return !is_joining(s); });
    if (first == candidates.end()) continue;  // no owner possible
    const uint32_t chosen = *first;
    set[0] = chosen;
    uint32_t n = 1;
    for (uint32_t s : candidates) {
      if (n == replicas) break;
      if (s != chosen) set[n++] = s;
    }
  }
  return live;
}

}  // namespace gcomp::cluster
