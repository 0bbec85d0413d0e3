// Block header layout, dtype bit layouts and the per-symbol mantissa widths shared by the
// encoder and decoder. Internal to codec/; docs/FORMAT.md is the specification.
#ifndef GCOMP_CODEC_INTERNAL_FORMAT_H_
#define GCOMP_CODEC_INTERNAL_FORMAT_H_

#include <algorithm>
#include <cstdint>

#include "codec/codec.h"

namespace gcomp::codec::internal {

inline constexpr uint32_t kBlockMagic = 0x31424347;  // "GCB1"
inline constexpr uint8_t kBlockVersion = 1;
inline constexpr uint32_t kFrameMagic = 0x31464347;  // "GCF1"
inline constexpr uint8_t kFrameVersion = 1;

// Byte offsets in the 56-byte block header.
enum HeaderOffset : size_t {
  kOffMagic = 0,
  kOffVersion = 4,
  kOffDType = 5,
  kOffMode = 6,
  kOffRelBits = 7,
  kOffAbsLog2 = 8,
  kOffZeroMap = 9,
  kOffTable = 10,
  kOffEmax = 11,
  kOffElements = 12,
  kOffNonzeros = 16,
  kOffMantissaBytes = 20,
  kOffZeroMapBytes = 24,
  kOffTableBytes = 28,
  kOffStreamBytes = 32,  // 4 x u32
  kOffChecksum = 48,
};

// Bit layout of a dtype: sign | exponent field (exp_bits) | mantissa (mant_bits).
struct FloatBits {
  int total_bits;
  int exp_bits;
  int mant_bits;
  int alphabet() const { return 1 << exp_bits; }
  int all_ones() const { return alphabet() - 1; }
};

inline FloatBits FloatBitsOf(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return {32, 8, 23};
    case DType::kBF16:
      return {16, 8, 7};
    case DType::kF16:
      return {16, 5, 10};
  }
  return {32, 8, 23};
}

inline bool IsValidDType(uint8_t v) { return v >= 1 && v <= 3; }

// Mantissa bits k kept for an element whose (rounded) exponent field is `sym`.
// Subnormals (field 0), the largest finite field and non-finite values keep every bit, which
// also means rounding can never carry a finite value into Inf.
inline int MantissaWidth(const FloatBits& lay, Mode mode, int rel_bits, int abs_log2, int emax,
                         int sym) {
  if (mode == Mode::kLossless || sym == 0 || sym >= lay.all_ones() - 1) return lay.mant_bits;
  const int d = emax - sym;
  const int k = std::clamp(-abs_log2 - 1 - d, 0, rel_bits);
  return std::min(k, lay.mant_bits);
}

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_FORMAT_H_
