// One chunk's whole state (ChunkSnapshot) <-> proto::ChunkState, the single serialization
// that checkpoints (server/checkpoint.h) and re-sharding move. Float arrays travel as f32
// GComp blocks in lossless mode, each with the XXH64 checksum of its bytes, so a decoded
// state is bit-identical to the encoded one. Thread-safe free functions.
#ifndef GCOMP_SERVER_CHUNK_STATE_H_
#define GCOMP_SERVER_CHUNK_STATE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_CHUNK_STATE_H_
