// GCOMP_HD marks the functions that the CPU codec and the CUDA kernels share: __host__
// __device__ under nvcc, plain inline elsewhere. The headers of format/ include nothing but
// <cstddef> and <cstdint>, so that nvcc compiles them for the device as they are.
#ifndef GCOMP_FORMAT_PORTABLE_H_
#define GCOMP_FORMAT_PORTABLE_H_

#include <cstdint>

#if defined(__CUDACC__)
#define GCOMP_HD __host__ __device__ __forceinline__
#else
#define GCOMP_HD inline
#endif

namespace gcomp::format {

// Little-endian loads from bytes of any alignment.
GCOMP_HD uint32_t LoadLE32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}
GCOMP_HD uint64_t LoadLE64(const uint8_t* p) {
  return uint64_t{LoadLE32(p)} | uint64_t{LoadLE32(p + 4)} << 32;
}

GCOMP_HD uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace gcomp::format

#endif  // GCOMP_FORMAT_PORTABLE_H_
