// XXH64 (xxHash's 64-bit hash) for the kernels: serial (Xxh64), and split so that 4 workers run
// its lanes (XxLane, then XxFinish); and the block checksum's seed (docs/FORMAT.md).
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_CHECKSUM_CUH_
#define GCOMP_GPU_INTERNAL_CHECKSUM_CUH_

#include <cstddef>
#include <cstdint>

#include "format/block_format.h"
#include "format/portable.h"
#include "gpu/internal/kernel_format.cuh"

namespace gcomp::gpu::internal {

inline constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

GCOMP_HD uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
GCOMP_HD uint64_t XxRound(uint64_t acc, uint64_t in) {
  acc += in * kP2;
  acc = Rotl64(acc, 31);
  return acc * kP1;
}
GCOMP_HD uint64_t XxMerge(uint64_t acc, uint64_t v) {
  acc ^= XxRound(0, v);
  return acc * kP1 + kP4;
}

// 8 bytes at p: one load where p is 8-byte aligned (device memory, block payloads), else bytes.
GCOMP_HD uint64_t Load64Any(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
#endif
  return LoadLE64(p);
}

// XXH64 splits input of >= 32 bytes into 32-byte stripes and runs 4 independent accumulators
// ("lanes") over the 4 words of each stripe; lanes can therefore run on 4 workers. XxLane is
// lane `lane` over every full stripe; XxFinish merges the lanes and hashes the tail.
GCOMP_HD uint64_t XxLane(const uint8_t* p, size_t len, uint64_t seed, int lane) {
  const uint64_t init[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
  uint64_t v = init[lane];
  const size_t stripes = len / 32;
  const uint8_t* q = p + 8 * lane;
  for (size_t i = 0; i < stripes; ++i, q += 32) v = XxRound(v, Load64Any(q));
  return v;
}

GCOMP_HD uint64_t XxFinish(const uint8_t* p, size_t len, uint64_t seed, const uint64_t* lanes) {
  const uint8_t* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    h = Rotl64(lanes[0], 1) + Rotl64(lanes[1], 7) + Rotl64(lanes[2], 12) + Rotl64(lanes[3], 18);
    for (int i = 0; i < 4; ++i) h = XxMerge(h, lanes[i]);
    p += len / 32 * 32;
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(len);
  while (p + 8 <= end) {
    h ^= XxRound(0, LoadLE64(p));
    h = Rotl64(h, 27) * kP1 + kP4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(LoadLE32(p)) * kP1;
    h = Rotl64(h, 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kP5;
    h = Rotl64(h, 11) * kP1;
    ++p;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

GCOMP_HD uint64_t Xxh64(const uint8_t* p, size_t len, uint64_t seed) {
  uint64_t lanes[4] = {};
  if (len >= 32) {
    for (int i = 0; i < 4; ++i) lanes[i] = XxLane(p, len, seed, i);
  }
  return XxFinish(p, len, seed, lanes);
}

// The block checksum: XXH64 of the sections seeded with XXH64 of header bytes 0..47. The
// codec drivers compute it in three steps (seed; 4 lanes on 4 workers; finish):
GCOMP_HD uint64_t ChecksumSeed(const uint8_t* block) { return Xxh64(block, fmt::kOffChecksum, 0); }

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_CHECKSUM_CUH_
