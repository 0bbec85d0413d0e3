// GComp block encode/decode on a CUDA device, byte-identical to codec/'s EncodeBlock and
// DecodeBlock (docs/FORMAT.md): the same input and policy give the same bytes on CPU and GPU,
// and each side decodes the other's blocks.
//
// A batch of chunks is encoded or decoded in one launch sequence on the caller's stream; block
// sizes and per-block results stay in device memory, so nothing waits for the device until the
// caller asks (GatherDecodeStatus). Host-only header.
//
// Requirements: every pointer in a chunk is device memory that stays valid until the stream
// reaches the end of the call's work; inputs to encode and outputs of decode are aligned to the
// element size; encode outputs are 8-byte aligned and hold BlockOutputBytes(elements, dtype).
// Blocks to decode may start at any byte. Thread-safe for calls on different streams.
//
// Limits: the encoder always writes its own (inline) code table, like codec::EncodeBlock
// without a shared table; a block that names a shared table (table kind 2) is rejected with
// NotFound by the GPU decoder (decode it with codec::DecodeBlock and a CodeTableStore).
#ifndef GCOMP_GPU_CODEC_H_
#define GCOMP_GPU_CODEC_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/codec.h"

namespace gcomp::gpu {

// Bytes the output of one block's encode needs for `elements` elements:
// codec::MaxBlockEncodedBytes rounded up to 8, because the encoder writes whole aligned
// 32-bit words. Usable without a device. (Not codec::MaxEncodedBytes, a frame's bound.)
size_t BlockOutputBytes(size_t elements, codec::DType dtype);

struct EncodeChunk {
  const void* in_dev = nullptr;  // `elements` elements of the batch's dtype
  uint32_t elements = 0;         // <= codec::kMaxBlockElements
  void* out_dev = nullptr;       // BlockOutputBytes(elements) bytes, 8-byte aligned
};

// Encodes chunks[i] into one block at chunks[i].out_dev and stores its byte size in
// out_bytes_dev[i] (device memory, num chunks entries). Asynchronous on `stream`: it returns
// after enqueuing. InvalidArgument for a bad policy, dtype or chunk; Unavailable without a
// device; other CUDA errors as Internal/ResourceExhausted.
absl::Status EncodeBatchAsync(codec::DType dtype, const codec::Policy& policy,
                         absl::Span<const EncodeChunk> chunks, uint32_t* out_bytes_dev,
                         cudaStream_t stream);

struct DecodeChunk {
  const void* in_dev = nullptr;  // a block of in_bytes_dev[i] bytes, any alignment
  uint32_t elements = 0;         // the block must hold exactly this many elements
  void* out_dev = nullptr;       // `elements` elements of the batch's dtype
};

// Decodes block i into chunks[i].out_dev. in_bytes_dev[i] (device memory) is block i's size,
// e.g. EncodeBatchAsync's out_bytes_dev; it must not exceed the memory readable at chunks[i].in_dev
// (the bytes themselves are never trusted). Each block's result code goes to status_dev[i] (device
// memory, 0 = OK); a bad block fails alone and its output is unspecified. Asynchronous.
absl::Status DecodeBatchAsync(codec::DType dtype, absl::Span<const DecodeChunk> chunks,
                              const uint32_t* in_bytes_dev, int32_t* status_dev,
                              cudaStream_t stream);

// Copies the per-block result codes to the host once, waits for `stream`, and returns OK or
// the status of the first failing block (DataLoss for corrupt bytes, InvalidArgument for a
// dtype or element count mismatch, NotFound for a shared-table block), naming its index.
absl::Status GatherDecodeStatus(const int32_t* status_dev, size_t num_chunks,
                                cudaStream_t stream);

// DecodeBatchAsync + GatherDecodeStatus with a status array of its own.
absl::Status DecodeBatchAsync(codec::DType dtype, absl::Span<const DecodeChunk> chunks,
                         const uint32_t* in_bytes_dev, cudaStream_t stream);

// The absl::Status for a per-block result code (as written to status_dev).
absl::Status BlockStatusToStatus(int32_t code, size_t block_index);

}  // namespace gcomp::gpu

#endif  // GCOMP_GPU_CODEC_H_
