// ShardService's per-tensor state, shared by its source files (shard_service.cc and the
// files it names); not part of any interface.
#ifndef GCOMP_SERVER_SHARD_TENSOR_H_
#define GCOMP_SERVER_SHARD_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "cluster/optimizer.h"
#include "cluster/shard_map.h"
#include "cluster/wire_block.h"
#include "codec/codec.h"
#include "proto/chunk_state.pb.h"
#include "proto/cluster_config.pb.h"
#include "server/shard_service.h"
#include "server/step_accumulator.h"

namespace gcomp::server {

inline absl::StatusOr<cluster::OptimizerOptions> OptimizerFrom(const proto::OptimizerConfig& c) {
  absl::StatusOr<cluster::OptimizerKind> kind = cluster::ParseOptimizerKind(c.name());
  if (!kind.ok()) return kind.status();
  cluster::OptimizerOptions o{*kind, c.learning_rate(), c.momentum(), c.beta1(), c.beta2(), c.epsilon()};
  absl::Status s = cluster::ValidateOptimizerOptions(o);
  if (!s.ok()) return s;
  return o;
}


// A chunk this shard backs up: the state its owner last replicated (merged from parts),
// or before any, the declared initial value. `synced`: this shard holds the chunk's
// acknowledged state (it backed the chunk up since its declaration, or got a state).
struct ShardService::TensorBackup {
  bool synced = false;
  bool has_state = false;
  // A backup taken on in place of copies on shards that went down, until it is synced:
  // those shards, so that losing the chunk before then names every copy that was lost.
  std::vector<uint32_t> replaced;
  proto::ChunkState state;
  proto::ChunkState partial;
  std::vector<float> initial;
};

struct ShardService::Tensor {
  std::string key;
  codec::DType dtype = codec::DType::kF32;
  cluster::ChunkLayout layout;
  cluster::OptimizerOptions optimizer;
  proto::OptimizerConfig optimizer_config;  // as resolved at declaration (for checkpoints)
  std::vector<uint32_t> owner;  // under the map served now; guarded by mu_
  // Owned chunks only; guarded by mu_ (a re-shard adds and removes them). Callers keep a
  // chunk's accumulator alive through its shared_ptr; the accumulators are thread-safe.
  absl::flat_hash_map<uint32_t, std::shared_ptr<StepAccumulator>> chunks;

  // Replication (replicas >= 2; all guarded by mu_). Each chunk's live replica set under
  // the map served now (ShardMap::LiveReplicas: `owner` is its first entry).
  std::vector<uint32_t> live;
  absl::flat_hash_map<uint32_t, TensorBackup> backups;  // chunks this shard backs up
  // Chunks whose every copy went down at once: the DataLoss message their calls get.
  absl::flat_hash_map<uint32_t, std::string> lost;

  // InvalidArgument past the last chunk.
  absl::Status CheckChunk(uint32_t chunk) const {
    if (chunk < layout.num_chunks) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("chunk ", chunk, " out of range: '", key,
                                                   "' has ", layout.num_chunks, " chunks"));
  }
  // "chunk 3 of 'w' is owned by shard 1": how a refusal names the owner (mu_ held, as for
  // `owner`).
  std::string OwnedBy(uint32_t chunk) const {
    return absl::StrCat("chunk ", chunk, " of '", key, "' is owned by shard ", owner[chunk]);
  }

  // How this tensor is declared, for checkpoints, moved state and a joining shard.
  proto::TensorDeclaration Declaration(const proto::ClusterConfig& config) const {
    proto::TensorDeclaration d;
    d.set_job(config.job());
    d.set_key(key);
    d.set_dtype(cluster::ToProto(dtype));
    d.set_elements(layout.elements);
    d.set_chunk_bytes(config.chunk_bytes());
    *d.mutable_optimizer() = optimizer_config;
    return d;
  }
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_SHARD_TENSOR_H_
