// The decoder's element pass: the choice between its scalar and AVX2 versions
// (join_elements_scalar.cc, join_elements_avx2.cc).
#include "codec/internal/join_elements.h"

#include "codec/internal/cpu.h"
#include "codec/internal/join_elements_kernels.h"

namespace gcomp::codec::internal {

absl::Status JoinElementsAt(VectorLevel level, DType dtype, const uint8_t* syms, size_t nnz,
                            absl::Span<const uint8_t> plane, const QuantParams& q,
                            const uint64_t* bitmap, size_t n, void* out, bool pdep) {
#if defined(__x86_64__)
  if (level > MaxVectorLevel()) level = MaxVectorLevel();
  if (level >= VectorLevel::kAvx2) {  // AVX-512 too: there is no AVX-512 join
    return JoinElementsAvx2(dtype, syms, nnz, plane, q, bitmap, n, out, pdep);
  }
#endif
  return JoinElementsScalar(dtype, syms, nnz, plane, q, bitmap, n, out);
}

absl::Status JoinElements(DType dtype, const uint8_t* syms, size_t nnz,
                          absl::Span<const uint8_t> plane, const QuantParams& q,
                          const uint64_t* bitmap, size_t n, void* out) {
  return JoinElementsAt(MaxVectorLevel(), dtype, syms, nnz, plane, q, bitmap, n, out, FastPext());
}

}  // namespace gcomp::codec::internal
