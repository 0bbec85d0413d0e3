// One chunk's whole state (ChunkSnapshot) <-> proto::ChunkState, the single serialization
// that checkpoints (server/checkpoint.h) and re-sharding move. Float arrays travel as f32
// GComp blocks in lossless mode, each with the XXH64 checksum of its bytes, so a decoded
// state is bit-identical to the encoded one. Thread-safe free functions.
#ifndef GCOMP_SERVER_CHUNK_STATE_H_
#define GCOMP_SERVER_CHUNK_STATE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/codec.h"
#include "proto/chunk_state.pb.h"
#include "server/step_accumulator.h"

namespace gcomp::server {

// Fills *out with (job, key, chunk) and the snapshot of a chunk of `elements` elements.
absl::Status ChunkStateToProto(const std::string& job, const std::string& key, uint32_t chunk,
                               size_t elements, const ChunkSnapshot& snapshot,
                               proto::ChunkState* out);

// Checks every field against the expected chunk size and the tensor's dtype (the cached
// result is a block of that dtype) and decodes. InvalidArgument for fields that disagree,
// DataLoss for a checksum mismatch or corrupt block; the message names the chunk.
absl::StatusOr<ChunkSnapshot> ChunkStateFromProto(const proto::ChunkState& state, size_t elements,
                                                  codec::DType dtype);

// Replies carry the shard-map epoch they were sent under: a restored or moved cached result
// is re-stamped with the epoch of the shard that now answers retries with it.
void StampEpoch(uint64_t epoch, ChunkSnapshot* snapshot);

// A state cut into parts that each fit a message of about one chunk: the first has the
// steps and the value, later ones one moment or the cached result each (with key and chunk).
std::vector<proto::ChunkState> SplitChunkState(proto::ChunkState state);

// Adds one part of SplitChunkState to `merged` (parts may come in any order). Unknown
// fields are dropped: a peer cannot make the merged state hold more than its blocks.
void MergeChunkStatePart(const proto::ChunkState& part, proto::ChunkState* merged);

// ResourceExhausted when a block of `part` (value, moments, cached result) holds more than
// the encoded bound of a chunk of `elements` floats: what a peer sending parts can make a
// shard buffer per chunk is then about its own state. `what` begins the message, e.g.
// "replicated part".
// Its names (the part's job and key, each block's address) are at most `max_name_bytes`
// (limits.max_key_bytes, or the job's name if longer): protobuf keeps a string whole.
absl::Status CheckChunkStatePart(const proto::ChunkState& part, size_t elements,
                                 size_t max_name_bytes, absl::string_view what);

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_CHUNK_STATE_H_
