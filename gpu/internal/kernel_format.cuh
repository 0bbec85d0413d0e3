// The block format as the kernels' codec uses it: the names it takes from format/ (the one
// definition of docs/FORMAT.md; nothing of it is declared again here), the policy a kernel is
// given, and how elements are loaded from block bytes.
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_KERNEL_FORMAT_CUH_
#define GCOMP_GPU_INTERNAL_KERNEL_FORMAT_CUH_

#include <cstdint>

#include "format/block_format.h"
#include "format/block_header.h"
#include "format/checksum.h"
#include "format/endian.h"
#include "format/huffman_code.h"
#include "format/portable.h"

namespace gcomp::gpu::internal {

namespace fmt = ::gcomp::format;
using fmt::AssignCodes;
using fmt::BuildLengths;
using fmt::CeilDiv;
using fmt::FloatBits;
using fmt::FloatBitsOfCode;
using fmt::HuffmanWork;
using fmt::kDecodeTableSize;
using fmt::kHeaderBytes;
using fmt::kMaxCodeLen;
using fmt::LoadLE16;
using fmt::LoadLE32;
using fmt::LoadLE64;
using fmt::StreamCount;
using fmt::StreamStart;
using fmt::TableRange;
using fmt::VarintBytes;
using fmt::XxFinish;
using fmt::Xxh64;
using fmt::XxLane;

struct BlockPolicy {
  int mode;  // 0 lossless, 1 near-lossless
  int rel_bits;
  int abs_log2;
};

// Mantissa bits kept for symbol s (docs/FORMAT.md, "the mantissa widths"): by the policy a
// kernel is given (encoding), or by the block's header (decoding).
GCOMP_HD int MantissaWidth(const FloatBits& lay, const BlockPolicy& p, int emax, int s) {
  return fmt::MantissaWidth(lay, p.mode, p.rel_bits, p.abs_log2, emax, s);
}
GCOMP_HD int MantissaWidth(const FloatBits& lay, const fmt::BlockHeader& h, int s) {
  return fmt::MantissaWidth(lay, h.mode, h.rel_bits, h.abs_log2, h.emax, s);
}

// Elements are read and written as unsigned integers of the dtype's width.
template <typename U>
GCOMP_HD U LoadElemBytes(const uint8_t* p) {
  if (sizeof(U) == 4) return static_cast<U>(LoadLE32(p));
  return static_cast<U>(LoadLE16(p));
}

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_KERNEL_FORMAT_CUH_
