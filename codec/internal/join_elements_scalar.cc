// The decoder's element pass without vector instructions: one element at a time, the
// reference the AVX2 pass must match, and what runs off x86-64.
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/internal/join_elements.h"
#include "codec/internal/join_elements_kernels.h"

namespace gcomp::codec::internal {
namespace {

template <typename U>
absl::Status JoinScalarTyped(const uint8_t* syms, size_t nnz, const uint8_t* plane, size_t size,
                             const QuantParams& q, const uint64_t* bitmap, size_t n, uint8_t* out) {
  uint64_t pos = 0;
  size_t j = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool nonzero = bitmap == nullptr || ((bitmap[i / 64] >> (i % 64)) & 1);
    PutElem<U>(out, i, nonzero ? NextElement<U>(syms, &j, plane, size, &pos, q) : U{0});
  }
  return CheckPlaneEnd(plane, size, pos);
}

}  // namespace

absl::Status JoinElementsScalar(DType dtype, const uint8_t* syms, size_t nnz,
                                absl::Span<const uint8_t> plane, const QuantParams& q,
                                const uint64_t* bitmap, size_t n, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  if (dtype == DType::kF32) {
    return JoinScalarTyped<uint32_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o);
  }
  return JoinScalarTyped<uint16_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o);
}

}  // namespace gcomp::codec::internal
