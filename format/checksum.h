// The block checksum (docs/FORMAT.md) and the XXH64 it is made of (xxHash's 64-bit hash,
// equal to the library's for every input): serial (Xxh64), and split so that 4 workers run
// its lanes (XxLane, then XxFinish), as the GPU codec does. The CPU codec hashes the
// sections with the xxHash library, seeded by BlockChecksumSeed like the GPU's.
#ifndef GCOMP_FORMAT_CHECKSUM_H_
#define GCOMP_FORMAT_CHECKSUM_H_

#include <cstddef>
#include <cstdint>

#include "format/block_format.h"
#include "format/endian.h"
#include "format/portable.h"

namespace gcomp::format {

inline constexpr uint64_t kXxPrime1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kXxPrime2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kXxPrime3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kXxPrime4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kXxPrime5 = 0x27D4EB2F165667C5ULL;

GCOMP_HD uint64_t XxRotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
GCOMP_HD uint64_t XxRound(uint64_t acc, uint64_t in) {
  acc += in * kXxPrime2;
  acc = XxRotl(acc, 31);
  return acc * kXxPrime1;
}
GCOMP_HD uint64_t XxMerge(uint64_t acc, uint64_t v) {
  acc ^= XxRound(0, v);
  return acc * kXxPrime1 + kXxPrime4;
}

// 8 bytes at p: one load where p is 8-byte aligned (device memory, block payloads), else bytes.
GCOMP_HD uint64_t XxLoad64(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
#endif
  return LoadLE64(p);
}

// XXH64 splits input of >= 32 bytes into 32-byte stripes and runs 4 independent accumulators
// ("lanes") over the 4 words of each stripe; lanes can therefore run on 4 workers. XxLane is
// lane `lane` over every full stripe; XxFinish merges the lanes and hashes the tail.
GCOMP_HD uint64_t XxLane(const uint8_t* p, size_t len, uint64_t seed, int lane) {
  const uint64_t init[4] = {seed + kXxPrime1 + kXxPrime2, seed + kXxPrime2, seed,
                            seed - kXxPrime1};
  uint64_t v = init[lane];
  const size_t stripes = len / 32;
  const uint8_t* q = p + 8 * lane;
  for (size_t i = 0; i < stripes; ++i, q += 32) v = XxRound(v, XxLoad64(q));
  return v;
}

GCOMP_HD uint64_t XxFinish(const uint8_t* p, size_t len, uint64_t seed, const uint64_t* lanes) {
  const uint8_t* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    h = XxRotl(lanes[0], 1) + XxRotl(lanes[1], 7) + XxRotl(lanes[2], 12) + XxRotl(lanes[3], 18);
    for (int i = 0; i < 4; ++i) h = XxMerge(h, lanes[i]);
    p += len / 32 * 32;
  } else {
    h = seed + kXxPrime5;
  }
  h += static_cast<uint64_t>(len);
  while (p + 8 <= end) {
    h ^= XxRound(0, LoadLE64(p));
    h = XxRotl(h, 27) * kXxPrime1 + kXxPrime4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(LoadLE32(p)) * kXxPrime1;
    h = XxRotl(h, 23) * kXxPrime2 + kXxPrime3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kXxPrime5;
    h = XxRotl(h, 11) * kXxPrime1;
    ++p;
  }
  h ^= h >> 33;
  h *= kXxPrime2;
  h ^= h >> 29;
  h *= kXxPrime3;
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

// The block checksum: XXH64 of the sections (bytes kHeaderBytes..) seeded with this, the
// XXH64 (seed 0) of the header bytes before the checksum field.
GCOMP_HD uint64_t BlockChecksumSeed(const uint8_t* block) { return Xxh64(block, kOffChecksum, 0); }

// The block's stored checksum, and where it goes.
GCOMP_HD uint64_t LoadBlockChecksum(const uint8_t* block) { return LoadLE64(block + kOffChecksum); }
GCOMP_HD void StoreBlockChecksum(uint8_t* block, uint64_t sum) {
  StoreLE64(block + kOffChecksum, sum);
}

}  // namespace gcomp::format

#endif  // GCOMP_FORMAT_CHECKSUM_H_
