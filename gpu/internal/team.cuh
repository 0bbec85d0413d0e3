// The team of kTeamThreads workers that runs one chunk's codec (encode_chunk.cuh,
// decode_chunk.cuh), written once as __host__ __device__ code. On the device a team is one CUDA
// thread block (ForEach runs the body on every thread, Sync is __syncthreads); on the host it is
// a loop over the same worker ids (HostTeam), which lets CPU-only tests run this exact code and
// compare its bytes with codec/. Also the atomics and bit counts worker bodies use on both, and
// how a chunk's elements are split among the workers.
//
// Discipline that keeps both executions equivalent: state that lives across a Sync() is in the
// codec's Shared struct (CUDA __shared__ memory, or one host object), never in locals of the
// driver; a body passed to ForEach touches only its own worker's slots, or uses the Atomic*
// helpers, or runs on worker 0 alone (OnWorker0).
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_TEAM_CUH_
#define GCOMP_GPU_INTERNAL_TEAM_CUH_

#include <cstdint>

#include "format/portable.h"

namespace gcomp::gpu::internal {

inline constexpr int kTeamThreads = 256;  // also the symbol tables' size: one worker per symbol

// Runs the workers one after another, in ascending order or in the order `order` gives (a
// permutation of the worker ids): a result that depends on the order between two Sync()
// calls would be a race on the device.
struct HostTeam {
  const int* order = nullptr;
  template <class F>
  GCOMP_HD void ForEach(F&& f) const {
    for (int t = 0; t < kTeamThreads; ++t) f(order != nullptr ? order[t] : t);
  }
  GCOMP_HD void Sync() const {}
};

struct DeviceTeam {
  template <class F>
  GCOMP_HD void ForEach(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x));
#endif
  }
  GCOMP_HD void Sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
};

// Runs f() on worker 0 alone; the other workers skip it.
template <class Team, class F>
GCOMP_HD void OnWorker0(const Team& team, F&& f) {
  team.ForEach([&](int t) {
    if (t == 0) f();
  });
}

GCOMP_HD void AtomicOr32(uint32_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  atomicOr(reinterpret_cast<unsigned int*>(p), v);
#else
  *p |= v;
#endif
}
GCOMP_HD void AtomicAdd32(uint32_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  atomicAdd(reinterpret_cast<unsigned int*>(p), v);
#else
  *p += v;
#endif
}
GCOMP_HD void AtomicMax32(uint32_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  atomicMax(reinterpret_cast<unsigned int*>(p), v);
#else
  if (v > *p) *p = v;
#endif
}

GCOMP_HD int Ctz64(uint64_t v) {
#ifdef __CUDA_ARCH__
  return __ffsll(static_cast<long long>(v)) - 1;
#else
  return __builtin_ctzll(v);
#endif
}
GCOMP_HD int Popc64(uint64_t v) {
#ifdef __CUDA_ARCH__
  return __popcll(v);
#else
  return __builtin_popcountll(v);
#endif
}

// Elements per worker segment: a multiple of 64, so bitmap words have a single owner.
GCOMP_HD uint32_t SegmentElems(uint32_t n) {
  const uint32_t per = static_cast<uint32_t>(::gcomp::format::CeilDiv(n, kTeamThreads));
  const uint32_t r = (per + 63) / 64 * 64;
  return r == 0 ? 64 : r;
}

// Worker t's elements [lo, hi) of n in segments of `seg` (SegmentElems(n)); empty (lo >= hi)
// for workers past the end.
struct Segment {
  uint32_t lo;
  uint32_t hi;
};
GCOMP_HD Segment SegmentOf(int t, uint32_t seg, uint32_t n) {
  const uint32_t lo = t * seg;
  return {lo, lo + seg < n ? lo + seg : n};
}

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_TEAM_CUH_
