// CompressedBlock <-> element buffers, shared by shards and workers: encodes one chunk
// raw (mode "none") or as one GComp block, and decodes with every check the wire needs.
// Thread-safe free functions.
#ifndef GCOMP_CLUSTER_WIRE_BLOCK_H_
#define GCOMP_CLUSTER_WIRE_BLOCK_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codec/codec.h"
#include "proto/block.pb.h"
#include "cluster/direction_codec.h"

namespace gcomp::cluster {

proto::DType ToProto(codec::DType dtype);
// InvalidArgument for DTYPE_UNSPECIFIED or unknown values.
absl::StatusOr<codec::DType> FromProto(proto::DType dtype);

// Largest `data` a block of n elements may carry (the codec's bound).
size_t MaxWireBytes(size_t n, codec::DType dtype);

// Fills dtype, elements, codec, policy, data, sections and checksum (by codec.checksum) of
// *out (not the address). `data` holds n elements of `dtype`.
absl::Status EncodeWireBlock(const DirectionCodec& codec, codec::DType dtype, const void* data,
                             size_t n, proto::CompressedBlock* out);

// Fills the same fields from bytes already encoded elsewhere (the GPU codec, or raw
// elements when dc.raw): one GComp block of n elements, or n raw elements. A GComp block's
// own checksum is verified first (Internal if it fails): receivers decode without it once
// the wire checksum matches.
absl::Status FillWireBlock(const DirectionCodec& codec, codec::DType dtype, size_t n,
                           std::string bytes, proto::CompressedBlock* out);

// Every check DecodeWireBlock makes short of decoding the payload: fields, checksum, the
// codec block's header and section sizes. Same errors.
absl::Status CheckWireBlock(const proto::CompressedBlock& block, codec::DType dtype, size_t n);

// The name of a block's dtype field for messages: the enum's name, or "unknown value N" for a
// number this build does not know (a peer may send any).
std::string WireDTypeName(proto::DType dtype);

// Decodes `block` into out[0, n) as `dtype`. Errors: InvalidArgument (dtype, element count,
// codec or size fields disagree with what is expected), DataLoss (checksum mismatch or a
// corrupt codec block). The codec block's own checksum is not recomputed: the wire checksum
// covers the same bytes (CheckWireBlock verifies both).
absl::Status DecodeWireBlock(const proto::CompressedBlock& block, codec::DType dtype, size_t n,
                             void* out);

// A block's payload as it arrived, in order: gRPC hands a received message over in slices,
// and the payload is read from them where they lie (cluster/wire_message.h).
using WirePieces = absl::Span<const absl::string_view>;

// The same two, with the block's fields from `header` (its own `data` is ignored) and the
// payload in `data`. A GComp payload in more than one piece is joined into *scratch first
// (the codec reads one contiguous block); raw elements are copied straight from the pieces.
absl::Status CheckWireBlock(const proto::CompressedBlock& header, WirePieces data,
                            codec::DType dtype, size_t n, std::string* scratch);
absl::Status DecodeWireBlock(const proto::CompressedBlock& header, WirePieces data,
                             codec::DType dtype, size_t n, void* out, std::string* scratch);

// The checksum of `data` (in order) by `kind`; InvalidArgument for a kind this build does
// not know.
absl::StatusOr<uint64_t> WireChecksum(proto::ChecksumKind kind, WirePieces data);

// The kind CheckWireBlock verifies besides XXH64, which shards list in
// RegisterWorkerResponse.checksums_read and workers in PullRequest.checksums_read.
inline constexpr proto::ChecksumKind kFastChecksum = proto::CHECKSUM_XXH3_64;

// Re-checksums *header (the fields of a block whose payload is `data`) by XXH64, the one
// kind peers of earlier versions read; a no-op for a block already checked by XXH64.
// DataLoss if `data` no longer matches the checksum it carries.
absl::Status UseXxh64(proto::CompressedBlock* header, WirePieces data);
// The same for a block with its own payload.
absl::Status UseXxh64(proto::CompressedBlock* block);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_WIRE_BLOCK_H_
