// Little-endian loads and stores at any alignment: the one home of the byte order of every
// number this project stores (blocks and frames, docs/FORMAT.md; checkpoints,
// docs/CHECKPOINT.md; .npy headers). Host and device code both use it; like the rest of
// format/ it includes nothing but <cstdint> and portable.h, so nvcc compiles it unchanged.
//
// On a little-endian host each call is one unaligned move (the memcpy compiles to it);
// elsewhere, and in device code, the bytes are put together one by one.
#ifndef GCOMP_FORMAT_ENDIAN_H_
#define GCOMP_FORMAT_ENDIAN_H_

#include <cstdint>

#include "format/portable.h"

#if !defined(__CUDA_ARCH__) && defined(__BYTE_ORDER__) && \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define GCOMP_FORMAT_NATIVE_LE 1
#else
#define GCOMP_FORMAT_NATIVE_LE 0
#endif

namespace gcomp::format {

GCOMP_HD uint16_t LoadLE16(const uint8_t* p) {
#if GCOMP_FORMAT_NATIVE_LE
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
#else
  return static_cast<uint16_t>(p[0] | p[1] << 8);
#endif
}

GCOMP_HD uint32_t LoadLE32(const uint8_t* p) {
#if GCOMP_FORMAT_NATIVE_LE
  uint32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
#else
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
#endif
}

GCOMP_HD uint64_t LoadLE64(const uint8_t* p) {
#if GCOMP_FORMAT_NATIVE_LE
  uint64_t v;
  __builtin_memcpy(&v, p, 8);
  return v;
#else
  return uint64_t{LoadLE32(p)} | uint64_t{LoadLE32(p + 4)} << 32;
#endif
}

GCOMP_HD void StoreLE16(uint8_t* p, uint16_t v) {
#if GCOMP_FORMAT_NATIVE_LE
  __builtin_memcpy(p, &v, 2);
#else
  for (int i = 0; i < 2; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
#endif
}

GCOMP_HD void StoreLE32(uint8_t* p, uint32_t v) {
#if GCOMP_FORMAT_NATIVE_LE
  __builtin_memcpy(p, &v, 4);
#else
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
#endif
}

GCOMP_HD void StoreLE64(uint8_t* p, uint64_t v) {
#if GCOMP_FORMAT_NATIVE_LE
  __builtin_memcpy(p, &v, 8);
#else
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
#endif
}

// The first n (at most 8) bytes at p as a little-endian number, the bytes above zero: the
// last word of a section that ends inside it. Reads nothing past p + n.
GCOMP_HD uint64_t LoadLE64Prefix(const uint8_t* p, uint32_t n) {
  uint64_t v = 0;
  for (uint32_t i = 0; i < n; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

}  // namespace gcomp::format

#undef GCOMP_FORMAT_NATIVE_LE

#endif  // GCOMP_FORMAT_ENDIAN_H_
