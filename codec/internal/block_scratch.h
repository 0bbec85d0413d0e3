// Block encoding without the copy into a std::string, for frames that place blocks
// themselves. Internal to codec/.
#ifndef GCOMP_CODEC_INTERNAL_BLOCK_SCRATCH_H_
#define GCOMP_CODEC_INTERNAL_BLOCK_SCRATCH_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "codec/codec.h"

namespace gcomp::codec::internal {

// EncodeBlock, but the block is left in this thread's scratch memory: the span is valid
// until the next block is encoded on this thread.
absl::StatusOr<absl::Span<const uint8_t>> EncodeBlockToScratch(
    DType dtype, const void* data, size_t n, const BlockEncodeOptions& options);

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_BLOCK_SCRATCH_H_
