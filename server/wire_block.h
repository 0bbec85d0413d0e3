// CompressedBlock <-> element buffers, shared by shards and workers: encodes one chunk
// raw (mode "none") or as one GComp block, and decodes with every check the wire needs.
// Thread-safe free functions.
#ifndef GCOMP_SERVER_WIRE_BLOCK_H_
#define GCOMP_SERVER_WIRE_BLOCK_H_

#include <cstddef>

#include "absl/status/status.h"
#include "codec/codec.h"
#include "proto/block.pb.h"
#include "server/cluster_config.h"

namespace gcomp::server {

proto::DType ToProto(codec::DType dtype);
// InvalidArgument for DTYPE_UNSPECIFIED or unknown values.
absl::StatusOr<codec::DType> FromProto(proto::DType dtype);

// Largest `data` a block of n elements may carry (the codec's bound).
size_t MaxWireBytes(size_t n, codec::DType dtype);

// Fills dtype, elements, codec, policy, data, sections and checksum of *out (not the
// address). `data` holds n elements of `dtype`.
absl::Status EncodeWireBlock(const DirectionCodec& codec, codec::DType dtype, const void* data,
                             size_t n, proto::CompressedBlock* out);

// Decodes `block` into out[0, n) as `dtype`. Errors: InvalidArgument (dtype, element count,
// codec or size fields disagree with what is expected), DataLoss (checksum mismatch or a
// corrupt codec block).
absl::Status DecodeWireBlock(const proto::CompressedBlock& block, codec::DType dtype, size_t n,
                             void* out);

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_WIRE_BLOCK_H_
