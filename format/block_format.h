// The GComp block format's constants and small rules, the single definition that codec/ (CPU)
// and gpu/ (CUDA kernels) both use. docs/FORMAT.md is the specification; this is its code.
#ifndef GCOMP_FORMAT_BLOCK_FORMAT_H_
#define GCOMP_FORMAT_BLOCK_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "format/portable.h"

namespace gcomp::format {

inline constexpr uint32_t kBlockMagic = 0x31424347;  // "GCB1"
inline constexpr uint8_t kBlockVersion = 1;
inline constexpr uint32_t kFrameMagic = 0x31464347;  // "GCF1"
inline constexpr uint8_t kFrameVersion = 1;

inline constexpr uint32_t kHeaderBytes = 56;
// Elements one block may hold (bounds every allocation a header can ask for).
inline constexpr uint32_t kMaxElements = uint32_t{1} << 26;
// Exponent codes are at most this long, so one 2^11-entry table decodes any of them.
inline constexpr int kMaxCodeLen = 11;
inline constexpr int kDecodeTableSize = 1 << kMaxCodeLen;
// The exponent symbols are coded as this many interleaved streams.
inline constexpr int kNumStreams = 4;

// Byte offsets in the 56-byte block header.
enum HeaderOffset : uint32_t {
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
  kOffStreamBytes = 32,  // kNumStreams x u32
  kOffChecksum = 48,
};

// The codes the header stores (codec.h's DType, Mode, ZeroMapKind and TableKind have the
// same values).
enum DTypeCode : uint8_t { kDTypeF32 = 1, kDTypeBF16 = 2, kDTypeF16 = 3 };
enum ModeCode : uint8_t { kModeLossless = 0, kModeNearLossless = 1 };
enum ZeroMapCode : uint8_t {
  kZeroMapNone = 0,
  kZeroMapBitmap = 1,
  kZeroMapZeroPositions = 2,
  kZeroMapNonzeroPositions = 3,
};
enum TableCode : uint8_t { kTableNone = 0, kTableInline = 1, kTableReference = 2, kTableStored = 3 };

GCOMP_HD bool IsValidDTypeCode(uint32_t code) { return code >= kDTypeF32 && code <= kDTypeF16; }

// Bit layout of a dtype: sign | exponent field (exp_bits) | mantissa (mant_bits).
struct FloatBits {
  int total_bits;
  int exp_bits;
  int mant_bits;
  GCOMP_HD int alphabet() const { return 1 << exp_bits; }
  GCOMP_HD int all_ones() const { return (1 << exp_bits) - 1; }
  GCOMP_HD int elem_bytes() const { return total_bits / 8; }
};

// The layout of a valid dtype code (f32 for anything else: callers validate first).
GCOMP_HD FloatBits FloatBitsOfCode(uint32_t dtype_code) {
  if (dtype_code == kDTypeBF16) return {16, 8, 7};
  if (dtype_code == kDTypeF16) return {16, 5, 10};
  return {32, 8, 23};
}

// Mantissa bits kept for an element whose (rounded) exponent field is `sym`
// (docs/FORMAT.md, "the mantissa widths"). Subnormals (field 0), the largest finite field and
// non-finite values keep every bit, which also means rounding can never carry a finite value
// into Inf.
GCOMP_HD int MantissaWidth(const FloatBits& bits, int mode, int rel_bits, int abs_log2, int emax,
                           int sym) {
  if (mode == kModeLossless || sym == 0 || sym >= bits.all_ones() - 1) return bits.mant_bits;
  int k = -abs_log2 - 1 - (emax - sym);
  k = k < 0 ? 0 : (k > rel_bits ? rel_bits : k);
  return k < bits.mant_bits ? k : bits.mant_bits;
}

// Symbols in stream s of n: n/4 each, the first n%4 streams get one more.
template <typename N>
GCOMP_HD N StreamCount(N n, int s) {
  return n / kNumStreams + (static_cast<N>(s) < n % kNumStreams ? 1 : 0);
}
// Index of stream s's first symbol.
template <typename N>
GCOMP_HD N StreamStart(N n, int s) {
  N start = 0;
  for (int i = 0; i < s; ++i) start += StreamCount(n, i);
  return start;
}
// The most bytes a stream of `count` symbols can take.
GCOMP_HD uint64_t MaxStreamBytesFor(uint64_t count) { return CeilDiv(count * kMaxCodeLen, 8); }

// Bytes of v as a LEB128 varint (the position lists of the zero map).
GCOMP_HD uint32_t VarintBytes(uint32_t v) {
  uint32_t n = 1;
  while (v >= 128) {
    v >>= 7;
    ++n;
  }
  return n;
}

}  // namespace gcomp::format

#endif  // GCOMP_FORMAT_BLOCK_FORMAT_H_
