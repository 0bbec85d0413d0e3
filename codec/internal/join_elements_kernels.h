// Pieces of the decoder's element pass that its scalar and AVX2 versions share
// (join_elements_scalar.cc, join_elements_avx2.cc), and the AVX2 entry point that
// join_elements.cc dispatches to. Include only from those files.
#ifndef GCOMP_CODEC_INTERNAL_JOIN_ELEMENTS_KERNELS_H_
#define GCOMP_CODEC_INTERNAL_JOIN_ELEMENTS_KERNELS_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/codec.h"
#include "codec/internal/bits.h"
#include "codec/internal/quantize.h"
#include "format/endian.h"

namespace gcomp::codec::internal {

// One field of `bits` (<= 24) bits at bit `pos` of plane[0, size); zeros past the end.
inline uint32_t FieldAt(const uint8_t* plane, size_t size, uint64_t pos, unsigned bits) {
  const uint64_t byte = pos >> 3;
  uint64_t x = 0;
  if (byte + 8 <= size) {
    x = format::LoadLE64(plane + byte);
  } else if (byte < size) {
    x = format::LoadLE64Prefix(plane + byte, static_cast<uint32_t>(size - byte));
  }
  return static_cast<uint32_t>(x >> (pos & 7)) & ((1u << bits) - 1);
}

// Same condition as BitReader::AtExactEnd: the fields end in the last byte, zero padded.
inline absl::Status CheckPlaneEnd(const uint8_t* plane, size_t size, uint64_t pos) {
  if ((pos + 7) / 8 != size || (pos % 8 != 0 && (plane[size - 1] >> (pos % 8)) != 0)) {
    return absl::DataLossError("sign/mantissa plane does not end at its last byte");
  }
  return absl::OkStatus();
}

template <typename U>
inline void PutElem(uint8_t* out, size_t i, U v) {
  std::memcpy(out + i * sizeof(U), &v, sizeof(U));
}

// The next nonzero element: its symbol, then its k + 1 bit field from the plane.
template <typename U>
inline U NextElement(const uint8_t* syms, size_t* j, const uint8_t* plane, size_t size,
                     uint64_t* pos, const QuantParams& q) {
  const uint32_t s = syms[(*j)++];
  const int k = WidthOf(q, static_cast<int>(s));
  const uint32_t f = FieldAt(plane, size, *pos, static_cast<unsigned>(k + 1));
  *pos += static_cast<unsigned>(k + 1);
  const uint32_t mant = f & ((1u << k) - 1);
  const uint32_t sign = (f >> k) & 1;
  return static_cast<U>((sign << q.top) | (s << q.mant_bits) | (mant << (q.mant_bits - k)));
}

#if defined(__x86_64__)
// JoinElements with AVX2 (and BMI2, POPCNT); call it only where MaxVectorLevel() allows.
// `pdep`: read near-lossless fields of up to 8 bits with PDEP (see FastPext in cpu.h).
absl::Status JoinElementsAvx2(DType dtype, const uint8_t* syms, size_t nnz,
                              absl::Span<const uint8_t> plane, const QuantParams& q,
                              const uint64_t* bitmap, size_t n, void* out, bool pdep);
#endif

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_JOIN_ELEMENTS_KERNELS_H_
