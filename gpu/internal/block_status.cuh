// The decoder's per-block verdicts (BlockStatus, written to device memory for each block;
// gpu/codec.cu turns them into absl::Status), and the verdict of each header rule of format/.
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_BLOCK_STATUS_CUH_
#define GCOMP_GPU_INTERNAL_BLOCK_STATUS_CUH_

#include <cstdint>

#include "format/block_header.h"
#include "format/portable.h"

namespace gcomp::gpu::internal {

// Per-block result codes written to device memory by the decoder; 0 is success.
enum BlockStatus : int32_t {
  kBlockOk = 0,
  kBlockTooShort,
  kBlockBadMagic,
  kBlockBadVersion,
  kBlockBadDType,
  kBlockBadPolicy,
  kBlockBadKind,
  kBlockBadEmax,
  kBlockBadCounts,
  kBlockBadSizeSum,
  kBlockBadSections,
  kBlockBadChecksum,
  kBlockBadTable,
  kBlockBadStream,
  kBlockBadZeroMap,
  kBlockBadPlane,
  kBlockWrongDType,
  kBlockWrongCount,
  kBlockTableReference,
  kBlockNumStatus,
};

// The per-block status of the first header rule a block breaks.
GCOMP_HD int32_t StatusOfHeaderError(::gcomp::format::HeaderError e) {
  using ::gcomp::format::HeaderError;
  switch (e) {
    case HeaderError::kOk: return kBlockOk;
    case HeaderError::kTooShort: return kBlockTooShort;
    case HeaderError::kBadMagic: return kBlockBadMagic;
    case HeaderError::kBadVersion: return kBlockBadVersion;
    case HeaderError::kBadDType: return kBlockBadDType;
    case HeaderError::kBadMode:
    case HeaderError::kBadRelBits:
    case HeaderError::kBadAbsLog2: return kBlockBadPolicy;
    case HeaderError::kBadZeroMapKind:
    case HeaderError::kBadTableKind: return kBlockBadKind;
    case HeaderError::kBadEmax: return kBlockBadEmax;
    case HeaderError::kTooManyElements:
    case HeaderError::kTooManyNonzeros: return kBlockBadCounts;
    case HeaderError::kBadSizeSum: return kBlockBadSizeSum;
    default: return kBlockBadSections;  // the rules on each section's size
  }
}

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_BLOCK_STATUS_CUH_
