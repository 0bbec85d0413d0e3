// The per-chunk GComp encoder and decoder the GPU kernels run, written once as __host__
// __device__ code over a team of workers (a CUDA thread block, or a loop on the host so that
// CPU-only tests run this exact code). docs/FORMAT.md specifies every byte. One file per part:
//   team.cuh           HostTeam / DeviceTeam, the rules worker code follows, atomics, segments
//   kernel_format.cuh  the names taken from format/ (whose checksum.h holds XXH64, serial
//                      and in 4 lanes, and the checksum's seed), BlockPolicy, element loads
//   bit_io.cuh         RangeBitWriter, ByteBitReader
//   block_status.cuh   the decoder's per-block verdicts
//   encode_chunk.cuh   EncodeChunk and its phases
//   decode_chunk.cuh   DecodeChunk and its phases
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_BLOCK_CODEC_CUH_
#define GCOMP_GPU_INTERNAL_BLOCK_CODEC_CUH_

#include "gpu/internal/bit_io.cuh"
#include "gpu/internal/block_status.cuh"
#include "gpu/internal/decode_chunk.cuh"
#include "gpu/internal/encode_chunk.cuh"
#include "gpu/internal/kernel_format.cuh"
#include "gpu/internal/team.cuh"

#endif  // GCOMP_GPU_INTERNAL_BLOCK_CODEC_CUH_
