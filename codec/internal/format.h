// The block format as codec/ uses it: the names of format/ (the single definition, shared
// with the GPU kernels), plus the few helpers that take codec.h's enums. Internal to
// codec/; docs/FORMAT.md is the specification.
#ifndef GCOMP_CODEC_INTERNAL_FORMAT_H_
#define GCOMP_CODEC_INTERNAL_FORMAT_H_

#include <cstdint>

#include "codec/codec.h"
#include "format/block_format.h"

namespace gcomp::codec::internal {

// The block header's bytes are format/'s alone (format::WriteHeader, format::ParseHeader).
using format::FloatBits;
using format::kFrameMagic;
using format::kFrameVersion;

// codec.h's enums store the format's codes as they are.
static_assert(static_cast<uint8_t>(DType::kF32) == format::kDTypeF32 &&
              static_cast<uint8_t>(DType::kBF16) == format::kDTypeBF16 &&
              static_cast<uint8_t>(DType::kF16) == format::kDTypeF16);
static_assert(static_cast<uint8_t>(Mode::kNearLossless) == format::kModeNearLossless);
static_assert(static_cast<uint8_t>(ZeroMapKind::kNonzeroPositions) ==
                  format::kZeroMapNonzeroPositions &&
              static_cast<uint8_t>(ZeroMapKind::kZeroPositions) == format::kZeroMapZeroPositions &&
              static_cast<uint8_t>(ZeroMapKind::kBitmap) == format::kZeroMapBitmap);
static_assert(static_cast<uint8_t>(TableKind::kStored) == format::kTableStored &&
              static_cast<uint8_t>(TableKind::kReference) == format::kTableReference &&
              static_cast<uint8_t>(TableKind::kInline) == format::kTableInline);

inline FloatBits FloatBitsOf(DType dtype) {
  return format::FloatBitsOfCode(static_cast<uint8_t>(dtype));
}

inline bool IsValidDType(uint8_t v) { return format::IsValidDTypeCode(v); }

// Mantissa bits k kept for an element whose (rounded) exponent field is `sym`.
inline int MantissaWidth(const FloatBits& lay, Mode mode, int rel_bits, int abs_log2, int emax,
                         int sym) {
  return format::MantissaWidth(lay, static_cast<int>(mode), rel_bits, abs_log2, emax, sym);
}

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_FORMAT_H_
