// The encoder's element pass without vector instructions: the reference that every
// vector level must match byte for byte, and what runs off x86-64.
#include <cstddef>
#include <cstdint>

#include "codec/internal/bits.h"
#include "codec/internal/quantize.h"
#include "codec/internal/quantize_kernels.h"

namespace gcomp::codec::internal {
namespace {

template <typename U>
size_t SplitScalarTyped(const U* in, size_t n, const QuantParams& q, uint8_t* plane, uint8_t* syms,
                        uint64_t* bitmap, size_t* nnz) {
  BitWriter w(plane);
  Group g;
  size_t j = 0;
  for (size_t lo = 0; lo < n; lo += kGroup) {
    const size_t count = n - lo < kGroup ? n - lo : kGroup;
    bitmap[lo / kGroup] = QuantizeScalarTyped(in + lo, count, q, &g);
    PackGroupScalar(g, count, &w, syms, &j);
  }
  *nnz = j;
  return w.Finish();
}

}  // namespace

int MaxFiniteExponentScalar(DType dtype, const void* in, size_t n) {
  const FloatBits lay = FloatBitsOf(dtype);
  const uint32_t mag_mask = (uint32_t{1} << (lay.total_bits - 1)) - 1;
  const uint32_t inf = static_cast<uint32_t>(lay.all_ones()) << lay.mant_bits;
  const uint32_t mag = dtype == DType::kF32
                           ? MaxFiniteMagScalar(static_cast<const uint32_t*>(in), n, mag_mask, inf)
                           : MaxFiniteMagScalar(static_cast<const uint16_t*>(in), n, mag_mask, inf);
  return static_cast<int>(mag >> lay.mant_bits);
}

size_t SplitElementsScalar(DType dtype, const void* in, size_t n, const QuantParams& q,
                           uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz) {
  if (dtype == DType::kF32) {
    return SplitScalarTyped(static_cast<const uint32_t*>(in), n, q, plane, syms, bitmap, nnz);
  }
  return SplitScalarTyped(static_cast<const uint16_t*>(in), n, q, plane, syms, bitmap, nnz);
}

}  // namespace gcomp::codec::internal
