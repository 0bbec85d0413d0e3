// The GPU codec's per-chunk algorithm run on the host: the same __host__ __device__ code the
// kernels run (gpu/internal/block_codec.cuh), with a thread block emulated by a loop over its
// worker ids. For tests that check, without a device, that the GPU path writes and reads
// exactly the bytes of docs/FORMAT.md. Not a production codec (use codec/). Host-only header.
#ifndef GCOMP_GPU_INTERNAL_HOST_CODEC_H_
#define GCOMP_GPU_INTERNAL_HOST_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/codec.h"

namespace gcomp::gpu::internal {

// The order in which the emulated thread block runs its workers between two barriers. The
// bytes must not depend on it; tests run all three to catch order dependencies (races).
enum class WorkerOrder { kAscending, kDescending, kShuffled };

// One block, as EncodeBatchAsync would write it for this chunk.
absl::StatusOr<std::string> HostEncodeBlock(codec::DType dtype, const void* data, size_t n,
                                            const codec::Policy& policy,
                                            WorkerOrder order = WorkerOrder::kAscending);

// Decodes one block into out[0, n) as DecodeBatchAsync would; the error is the one the device
// would report for this block.
absl::Status HostDecodeBlock(absl::Span<const uint8_t> block, codec::DType dtype, void* out,
                             size_t n, WorkerOrder order = WorkerOrder::kAscending);

// XXH64 as implemented for the device (checked against the xxHash library in tests).
uint64_t HostXxh64(const void* data, size_t len, uint64_t seed);

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_HOST_CODEC_H_
