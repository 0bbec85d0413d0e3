// The decoder's per-element pass of a block, the inverse of SplitElements (quantize.h):
// rebuild each element from its symbol and its sign + mantissa field, and spread the
// nonzeros by the zero bitmap. The scalar and AVX2 paths (join_elements_scalar.cc,
// join_elements_avx2.cc; join_elements.cc picks one) rebuild the same elements.
#ifndef GCOMP_CODEC_INTERNAL_JOIN_ELEMENTS_H_
#define GCOMP_CODEC_INTERNAL_JOIN_ELEMENTS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/codec.h"
#include "codec/internal/cpu.h"
#include "codec/internal/quantize.h"

namespace gcomp::codec::internal {

// Rebuilds the n elements of a block (dtype-sized, at `out`, which may be unaligned) from
// the symbols of its nnz nonzero elements (syms needs 8 readable bytes past them), the
// sign + mantissa plane (section 1) and the nonzero bitmap (null when nnz == n; otherwise
// its popcount must be nnz). DataLoss if the plane does not end exactly at its last byte
// with zero padding.
absl::Status JoinElements(DType dtype, const uint8_t* syms, size_t nnz,
                          absl::Span<const uint8_t> plane, const QuantParams& q,
                          const uint64_t* bitmap, size_t n, void* out);
// JoinElements limited to `level` (clamped to MaxVectorLevel()), and the same without the
// vector path (tests compare them). `pdep`: whether the vector pass may read fields of up
// to 8 bits with PDEP (same elements either way; JoinElements passes FastPext()).
absl::Status JoinElementsAt(VectorLevel level, DType dtype, const uint8_t* syms, size_t nnz,
                            absl::Span<const uint8_t> plane, const QuantParams& q,
                            const uint64_t* bitmap, size_t n, void* out, bool pdep);
absl::Status JoinElementsScalar(DType dtype, const uint8_t* syms, size_t nnz,
                                absl::Span<const uint8_t> plane, const QuantParams& q,
                                const uint64_t* bitmap, size_t n, void* out);

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_JOIN_ELEMENTS_H_
