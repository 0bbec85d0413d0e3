// The block header (docs/FORMAT.md) in memory, written and read: WriteHeader for both
// encoders; ParseHeader, which checks every rule that the header alone decides, before the
// checksum and before anything is allocated. One definition for the CPU codec
// (codec/block.cc), which turns a HeaderError into a status message, and the GPU codec,
// which turns it into a per-block status code.
#ifndef GCOMP_FORMAT_BLOCK_HEADER_H_
#define GCOMP_FORMAT_BLOCK_HEADER_H_

#include <cstdint>

#include "format/block_format.h"
#include "format/endian.h"
#include "format/portable.h"

namespace gcomp::format {

// The header's fields as stored (codes not yet known to be valid until ParseHeader says so).
// The one in-memory header of both codecs: encoders fill it, WriteHeader stores it.
struct BlockHeader {
  uint8_t version;
  uint8_t dtype;
  uint8_t mode;
  uint8_t rel_bits;
  int8_t abs_log2;
  uint8_t zero_map;
  uint8_t table;
  uint8_t emax;
  uint32_t elements;
  uint32_t nonzeros;
  uint32_t mantissa_bytes;
  uint32_t zero_map_bytes;
  uint32_t table_bytes;
  uint32_t stream_bytes[kNumStreams];
  uint64_t exponent_bytes;  // sum of stream_bytes (set by ParseHeader; WriteHeader ignores it)
  uint64_t section_bytes;   // header + every section (likewise)
};

// Header bytes [0, kOffChecksum) of b: the magic, kBlockVersion (b.version is not read) and
// b's fields. The checksum (format/checksum.h) goes in once the sections are written.
GCOMP_HD void WriteHeader(const BlockHeader& b, uint8_t* h) {
  StoreLE32(h + kOffMagic, kBlockMagic);
  h[kOffVersion] = kBlockVersion;
  h[kOffDType] = b.dtype;
  h[kOffMode] = b.mode;
  h[kOffRelBits] = b.rel_bits;
  h[kOffAbsLog2] = static_cast<uint8_t>(b.abs_log2);
  h[kOffZeroMap] = b.zero_map;
  h[kOffTable] = b.table;
  h[kOffEmax] = b.emax;
  StoreLE32(h + kOffElements, b.elements);
  StoreLE32(h + kOffNonzeros, b.nonzeros);
  StoreLE32(h + kOffMantissaBytes, b.mantissa_bytes);
  StoreLE32(h + kOffZeroMapBytes, b.zero_map_bytes);
  StoreLE32(h + kOffTableBytes, b.table_bytes);
  for (int s = 0; s < kNumStreams; ++s) StoreLE32(h + kOffStreamBytes + 4 * s, b.stream_bytes[s]);
}

// The header of b's elements stored raw (what an encoder writes when coding would not make
// the block smaller): b's dtype, policy and emax, every element a "nonzero" of the plane.
GCOMP_HD BlockHeader StoredHeader(const BlockHeader& b) {
  BlockHeader r = b;
  r.version = kBlockVersion;
  r.zero_map = kZeroMapNone;
  r.table = kTableStored;
  r.nonzeros = b.elements;
  r.mantissa_bytes = b.elements * static_cast<uint32_t>(FloatBitsOfCode(b.dtype).elem_bytes());
  r.zero_map_bytes = 0;
  r.table_bytes = 0;
  for (int s = 0; s < kNumStreams; ++s) r.stream_bytes[s] = 0;
  r.exponent_bytes = 0;
  r.section_bytes = kHeaderBytes + uint64_t{r.mantissa_bytes};
  return r;
}

// The first rule a header breaks, in the order ParseHeader checks them.
enum class HeaderError : int32_t {
  kOk = 0,
  kTooShort,             // fewer bytes than a header
  kBadMagic,
  kBadVersion,
  kBadDType,
  kBadMode,
  kBadRelBits,           // above 23
  kBadAbsLog2,           // above 0
  kBadZeroMapKind,
  kBadTableKind,
  kBadEmax,              // the all-ones field (Inf/NaN) or above
  kTooManyElements,      // above kMaxElements
  kTooManyNonzeros,      // above the element count
  kBadSizeSum,           // sections do not add up to the block's size
  kBadStoredSections,    // a stored block with anything but n raw elements
  kTableVsNonzeros,      // table kind 'none' exactly when there are no nonzeros
  kBadEmptySections,     // no nonzeros, yet a nonempty table, stream or plane
  kBadInlineTableSize,   // outside [3, 130]
  kBadReferenceSize,     // not 8
  kZerosWithoutMap,      // zero map 'none' but zeros present
  kBadBitmapSize,
  kBadPositionListSize,
  kStreamTooLarge,       // more bytes than its symbols can take
  kBadPlaneSize,         // sign/mantissa plane outside its bounds
};

// Fills *out from the first kHeaderBytes of h (when size allows) and checks it against a
// block of `size` bytes; kOk when every header rule holds.
GCOMP_HD HeaderError ParseHeader(const uint8_t* h, uint64_t size, BlockHeader* out) {
  if (size < kHeaderBytes) return HeaderError::kTooShort;
  BlockHeader& b = *out;
  b.version = h[kOffVersion];
  b.dtype = h[kOffDType];
  b.mode = h[kOffMode];
  b.rel_bits = h[kOffRelBits];
  b.abs_log2 = static_cast<int8_t>(h[kOffAbsLog2]);
  b.zero_map = h[kOffZeroMap];
  b.table = h[kOffTable];
  b.emax = h[kOffEmax];
  b.elements = LoadLE32(h + kOffElements);
  b.nonzeros = LoadLE32(h + kOffNonzeros);
  b.mantissa_bytes = LoadLE32(h + kOffMantissaBytes);
  b.zero_map_bytes = LoadLE32(h + kOffZeroMapBytes);
  b.table_bytes = LoadLE32(h + kOffTableBytes);
  b.exponent_bytes = 0;
  for (int s = 0; s < kNumStreams; ++s) {
    b.stream_bytes[s] = LoadLE32(h + kOffStreamBytes + 4 * s);
    b.exponent_bytes += b.stream_bytes[s];
  }
  b.section_bytes = uint64_t{b.mantissa_bytes} + b.zero_map_bytes + b.table_bytes +
                    b.exponent_bytes + kHeaderBytes;

  if (LoadLE32(h + kOffMagic) != kBlockMagic) return HeaderError::kBadMagic;
  if (b.version != kBlockVersion) return HeaderError::kBadVersion;
  if (!IsValidDTypeCode(b.dtype)) return HeaderError::kBadDType;
  const FloatBits bits = FloatBitsOfCode(b.dtype);
  if (b.mode > kModeNearLossless) return HeaderError::kBadMode;
  if (b.rel_bits > 23) return HeaderError::kBadRelBits;
  if (b.abs_log2 > 0) return HeaderError::kBadAbsLog2;
  if (b.zero_map > kZeroMapNonzeroPositions) return HeaderError::kBadZeroMapKind;
  if (b.table > kTableStored) return HeaderError::kBadTableKind;
  if (b.emax >= bits.all_ones()) return HeaderError::kBadEmax;
  const uint64_t n = b.elements, nnz = b.nonzeros;
  if (n > kMaxElements) return HeaderError::kTooManyElements;
  if (nnz > n) return HeaderError::kTooManyNonzeros;
  if (b.section_bytes != size) return HeaderError::kBadSizeSum;

  if (b.table == kTableStored) {
    if (b.zero_map != kZeroMapNone || b.zero_map_bytes || b.table_bytes || b.exponent_bytes ||
        nnz != n || b.mantissa_bytes != n * static_cast<uint64_t>(bits.elem_bytes())) {
      return HeaderError::kBadStoredSections;
    }
    return HeaderError::kOk;
  }
  if ((b.table == kTableNone) != (nnz == 0)) return HeaderError::kTableVsNonzeros;
  if (b.table == kTableNone && (b.table_bytes || b.exponent_bytes || b.mantissa_bytes)) {
    return HeaderError::kBadEmptySections;
  }
  if (b.table == kTableInline && (b.table_bytes < 3 || b.table_bytes > 130)) {
    return HeaderError::kBadInlineTableSize;
  }
  if (b.table == kTableReference && b.table_bytes != 8) return HeaderError::kBadReferenceSize;
  const uint64_t zeros = n - nnz;
  switch (b.zero_map) {
    case kZeroMapNone:
      if (zeros != 0 || b.zero_map_bytes != 0) return HeaderError::kZerosWithoutMap;
      break;
    case kZeroMapBitmap:
      if (b.zero_map_bytes != CeilDiv(n, 8)) return HeaderError::kBadBitmapSize;
      break;
    default: {
      const uint64_t entries = b.zero_map == kZeroMapZeroPositions ? zeros : nnz;
      if (b.zero_map_bytes < entries || b.zero_map_bytes > 4 * entries) {
        return HeaderError::kBadPositionListSize;
      }
    }
  }
  for (int s = 0; s < kNumStreams; ++s) {
    if (b.stream_bytes[s] > MaxStreamBytesFor(StreamCount(nnz, s))) {
      return HeaderError::kStreamTooLarge;
    }
  }
  if (b.mantissa_bytes > CeilDiv(nnz * (bits.mant_bits + 1), 8) ||
      b.mantissa_bytes < CeilDiv(nnz, 8)) {
    return HeaderError::kBadPlaneSize;
  }
  return HeaderError::kOk;
}

}  // namespace gcomp::format

#endif  // GCOMP_FORMAT_BLOCK_HEADER_H_
