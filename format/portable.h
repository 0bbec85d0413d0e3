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

GCOMP_HD uint64_t CeilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace gcomp::format

#endif  // GCOMP_FORMAT_PORTABLE_H_
