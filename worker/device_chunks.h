// Chunks of a tensor that lives in CUDA device memory, for Client: gradients are compressed
// where they live (all chunks in one GPU batch, then one copy of the blocks to the host),
// and results are decoded on the GPU straight into the caller's device buffer. Host tensors
// never come here; they use the CPU codec.
//
// The GPU codec writes the same bytes as the CPU codec (docs/FORMAT.md), so shards cannot
// tell the two apart. Thread-safe: each call uses a stream of its own.
#ifndef GCOMP_WORKER_DEVICE_CHUNKS_H_
#define GCOMP_WORKER_DEVICE_CHUNKS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cluster/cluster_config.h"
#include "cluster/shard_map.h"
#include "codec/codec.h"
#include "proto/block.pb.h"

namespace gcomp::worker {

// Host copies of the chunks of `input_dev` (layout.elements elements of dtype, aligned to
// the element size): one GComp block per chunk, or the raw elements when `dc.raw`.
absl::StatusOr<std::vector<std::string>> EncodeDeviceChunks(const cluster::DirectionCodec& dc,
                                                            codec::DType dtype,
                                                            const void* input_dev,
                                                            const cluster::ChunkLayout& layout);

// Writes reply blocks (one per chunk in chunk order, each already passed
// cluster::CheckWireBlock) into `output_dev`. DataLoss names the first bad chunk.
absl::Status DecodeDeviceChunks(codec::DType dtype,
                                absl::Span<const proto::CompressedBlock> blocks,
                                const cluster::ChunkLayout& layout, void* output_dev);

}  // namespace gcomp::worker

#endif  // GCOMP_WORKER_DEVICE_CHUNKS_H_
