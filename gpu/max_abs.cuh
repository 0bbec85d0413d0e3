// Device code for MaxAbsFinite; included only by .cu files.
#ifndef GCOMP_GPU_MAX_ABS_CUH_
#define GCOMP_GPU_MAX_ABS_CUH_

#include <cstddef>
#include <cstdint>

namespace gcomp::gpu::internal {

// Non-negative floats order like their bit patterns, so an unsigned atomicMax on the
// bits of |x| gives the float maximum. *out_bits must start at 0.
__global__ void MaxAbsFiniteKernel(const float* __restrict__ in_dev, size_t n,
                                   unsigned int* __restrict__ out_bits_dev) {
  unsigned int local = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const unsigned int bits = __float_as_uint(in_dev[i]) & 0x7fffffffu;
    if (bits < 0x7f800000u && bits > local) local = bits;  // skip Inf and NaN
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const unsigned int other = __shfl_down_sync(0xffffffffu, local, offset);
    if (other > local) local = other;
  }
  if ((threadIdx.x & 31) == 0) atomicMax(out_bits_dev, local);
}

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_MAX_ABS_CUH_
