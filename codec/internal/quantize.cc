#include "codec/internal/quantize.h"

#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "codec/internal/bits.h"
#include "codec/internal/cpu.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcomp::codec::internal {

QuantParams MakeQuantParams(const FloatBits& lay, const Policy& policy, int emax) {
  QuantParams q;
  q.mant_bits = lay.mant_bits;
  q.top = lay.total_bits - 1;
  q.mag_mask = static_cast<uint32_t>((uint64_t{1} << q.top) - 1);
  q.mant_mask = (uint32_t{1} << lay.mant_bits) - 1;
  q.special_above = lay.all_ones() - 2;
  if (policy.mode == Mode::kLossless) {
    q.zero_test = ~uint32_t{0};
    q.zero_below = 0;
    q.width_offset = 1 << 20;  // every ordinary symbol saturates at width_cap = W
    q.width_cap = lay.mant_bits;
  } else {
    q.zero_test = q.mag_mask;
    q.zero_below = emax + policy.abs_log2 > 0 ? emax + policy.abs_log2 : 0;
    q.width_offset = -policy.abs_log2 - 1 - emax;
    q.width_cap = policy.rel_bits < lay.mant_bits ? policy.rel_bits : lay.mant_bits;
  }
  return q;
}

namespace {

// One group of count <= kGroup elements (scalar path): value[i] (sign + mantissa bits),
// bits[i] (0 for a zero, else k + 1), sym[i] (rounded exponent field).
constexpr size_t kGroup = 64;
struct Group {
  uint32_t value[kGroup];
  uint32_t bits[kGroup];
  uint32_t sym[kGroup];
};

template <typename U>
uint64_t QuantizeScalarTyped(const U* in, size_t count, const QuantParams& q, Group* g) {
  const int W = q.mant_bits;
  uint64_t mask = 0;
  for (size_t i = 0; i < count; ++i) {
    U raw;
    std::memcpy(&raw, in + i, sizeof(U));
    const uint32_t u = raw;
    const uint32_t mag = u & q.mag_mask;
    const int e = static_cast<int>(mag >> W);
    const uint32_t nz = (e >= q.zero_below) & ((u & q.zero_test) != 0);
    const int drop = W - WidthOf(q, e);
    const uint32_t r = (mag + ((1u << drop) >> 1)) & (~0u << drop);
    const int e2 = static_cast<int>(r >> W);
    const int k2 = WidthOf(q, e2);
    const uint32_t value = ((r & q.mant_mask) >> (W - k2)) | ((u >> q.top) << k2);
    g->value[i] = value & (0u - nz);
    g->bits[i] = static_cast<uint32_t>(k2 + 1) & (0u - nz);
    g->sym[i] = static_cast<uint32_t>(e2);
    mask |= uint64_t{nz} << i;
  }
  return mask;
}

// Appends the k + 1 bit fields of a quantized group to the plane and its nonzero symbols to
// syms[*j...]; two fields (<= 48 bits) per Put (and Flush, for a BitWriter).
template <typename Writer>
void PackGroupScalar(const Group& g, size_t count, Writer* plane, uint8_t* syms, size_t* j) {
  size_t i = 0, k = *j;
  for (; i + 2 <= count; i += 2) {
    plane->Put(g.value[i] | (uint64_t{g.value[i + 1]} << g.bits[i]), g.bits[i] + g.bits[i + 1]);
    if constexpr (std::is_same_v<Writer, BitWriter>) plane->Flush();
    syms[k] = static_cast<uint8_t>(g.sym[i]);
    k += g.bits[i] != 0;
    syms[k] = static_cast<uint8_t>(g.sym[i + 1]);
    k += g.bits[i + 1] != 0;
  }
  if (i < count) {
    plane->Put(g.value[i], g.bits[i]);
    if constexpr (std::is_same_v<Writer, BitWriter>) plane->Flush();
    syms[k] = static_cast<uint8_t>(g.sym[i]);
    k += g.bits[i] != 0;
  }
  *j = k;
}

template <typename U>
size_t SplitScalarTyped(const U* in, size_t n, const QuantParams& q, uint8_t* plane, uint8_t* syms,
                        uint64_t* bitmap, size_t* nnz) {
  BitWriter w(plane);
  Group g;
  size_t j = 0;
  for (size_t lo = 0; lo < n; lo += kGroup) {
    const size_t count = n - lo < kGroup ? n - lo : kGroup;
    bitmap[lo / kGroup] = QuantizeScalarTyped(in + lo, count, q, &g);
    PackGroupScalar(g, count, &w, syms, &j);
  }
  *nnz = j;
  return w.Finish();
}

// One field of `bits` (<= 24) bits at bit `pos` of plane[0, size); zeros past the end.
inline uint32_t FieldAt(const uint8_t* plane, size_t size, uint64_t pos, unsigned bits) {
  const uint64_t byte = pos >> 3;
  uint64_t x = 0;
  if (byte + 8 <= size) {
    x = Load64(plane + byte);
  } else {
    for (uint64_t b = byte; b < size && b < byte + 8; ++b)
      x |= uint64_t{plane[b]} << (8 * (b - byte));
  }
  return static_cast<uint32_t>(x >> (pos & 7)) & ((1u << bits) - 1);
}

// Same condition as BitReader::AtExactEnd: the fields end in the last byte, zero padded.
absl::Status CheckPlaneEnd(const uint8_t* plane, size_t size, uint64_t pos) {
  if ((pos + 7) / 8 != size || (pos % 8 != 0 && (plane[size - 1] >> (pos % 8)) != 0)) {
    return absl::DataLossError("sign/mantissa plane does not end at its last byte");
  }
  return absl::OkStatus();
}

template <typename U>
inline void PutElem(uint8_t* out, size_t i, U v) {
  std::memcpy(out + i * sizeof(U), &v, sizeof(U));
}

// The next nonzero element: its symbol, then its k + 1 bit field from the plane.
template <typename U>
inline U NextElement(const uint8_t* syms, size_t* j, const uint8_t* plane, size_t size,
                     uint64_t* pos, const QuantParams& q) {
  const uint32_t s = syms[(*j)++];
  const int k = WidthOf(q, static_cast<int>(s));
  const uint32_t f = FieldAt(plane, size, *pos, static_cast<unsigned>(k + 1));
  *pos += static_cast<unsigned>(k + 1);
  const uint32_t mant = f & ((1u << k) - 1);
  const uint32_t sign = (f >> k) & 1;
  return static_cast<U>((sign << q.top) | (s << q.mant_bits) | (mant << (q.mant_bits - k)));
}

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

// Non-negative magnitudes order like their bit patterns; non-finite ones count as 0.
template <typename U>
uint32_t MaxFiniteMagScalar(const U* in, size_t n, uint32_t mag_mask, uint32_t inf) {
  uint32_t best = 0;
  for (size_t i = 0; i < n; ++i) {
    U raw;
    std::memcpy(&raw, in + i, sizeof(U));
    uint32_t mag = raw & mag_mask;
    mag = mag < inf ? mag : 0;
    best = mag > best ? mag : best;
  }
  return best;
}

#if defined(__x86_64__)

template <typename U>
__attribute__((target("avx2"))) inline __m256i Load8(const U* p) {
  if constexpr (sizeof(U) == 4) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

template <typename U>
__attribute__((target("avx2"))) uint32_t MaxFiniteMagAvx2(const U* in, size_t n, uint32_t mag_mask,
                                                          uint32_t inf) {
  const __m256i mm = _mm256_set1_epi32(static_cast<int>(mag_mask));
  const __m256i limit = _mm256_set1_epi32(static_cast<int>(inf));
  __m256i best = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i mag = _mm256_and_si256(Load8(in + i), mm);
    // mag < inf (both below 2^31, so the signed compare is exact)
    const __m256i finite = _mm256_cmpgt_epi32(limit, mag);
    best = _mm256_max_epu32(best, _mm256_and_si256(mag, finite));
  }
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), best);
  uint32_t result = MaxFiniteMagScalar(in + i, n - i, mag_mask, inf);
  for (uint32_t lane : lanes) result = lane > result ? lane : result;
  return result;
}

// k(s) for 8 symbols at once; see WidthOf.
__attribute__((target("avx2"))) inline __m256i WidthOf8(__m256i s, __m256i offset, __m256i cap,
                                                        __m256i full, __m256i special_above) {
  __m256i k = _mm256_add_epi32(s, offset);
  k = _mm256_max_epi32(k, _mm256_setzero_si256());
  k = _mm256_min_epi32(k, cap);
  const __m256i special = _mm256_or_si256(_mm256_cmpeq_epi32(s, _mm256_setzero_si256()),
                                          _mm256_cmpgt_epi32(s, special_above));
  return _mm256_blendv_epi8(k, full, special);
}

// kCompact.index[m]: pshufb indices moving the bytes whose bit is set in m to the front.
// kCompact.triples[m]: for 4 32-bit lanes, indices moving bytes 0-2 of each lane whose bit
// is set in m (m < 16) to the front.
struct CompactTables {
  uint64_t index[256];
  uint8_t triples[16][16];
  constexpr CompactTables() : index(), triples() {
    for (int m = 0; m < 256; ++m) {
      uint64_t v = ~uint64_t{0};  // 0xff lanes read as zero
      int k = 0;
      for (int bit = 0; bit < 8; ++bit) {
        if (m & (1 << bit)) {
          v &= ~(uint64_t{0xff} << (8 * k));
          v |= uint64_t(bit) << (8 * k);
          ++k;
        }
      }
      index[m] = v;
    }
    for (int m = 0; m < 16; ++m) {
      int k = 0;
      for (int lane = 0; lane < 4; ++lane) {
        if (m & (1 << lane)) {
          for (int b = 0; b < 3; ++b) triples[m][k++] = static_cast<uint8_t>(4 * lane + b);
        }
      }
      while (k < 16) triples[m][k++] = 0xff;
    }
  }
};
constexpr CompactTables kCompact;

// QuantParams broadcast to vectors, made once per block (the compiler cannot hoist the
// loads itself: the output stores might alias the params).
struct QuantVectors {
  __m256i mag_mask, mant_mask, zero_test, zero_floor, offset, cap, full, special_above,
      ordinary_limit, half_w, one, all;
  __m128i W, top;
};
__attribute__((target("avx2"))) inline QuantVectors MakeQuantVectors(const QuantParams& q) {
  QuantVectors v;
  v.mag_mask = _mm256_set1_epi32(static_cast<int>(q.mag_mask));
  v.mant_mask = _mm256_set1_epi32(static_cast<int>(q.mant_mask));
  v.zero_test = _mm256_set1_epi32(static_cast<int>(q.zero_test));
  v.zero_floor = _mm256_set1_epi32(q.zero_below - 1);
  v.offset = _mm256_set1_epi32(q.width_offset);
  v.cap = _mm256_set1_epi32(q.width_cap);
  v.full = _mm256_set1_epi32(q.mant_bits);
  v.special_above = _mm256_set1_epi32(q.special_above);
  v.ordinary_limit = _mm256_set1_epi32(q.special_above - 1);
  v.half_w = _mm256_set1_epi32(1 << (q.mant_bits - 1));
  v.one = _mm256_set1_epi32(1);
  v.all = _mm256_set1_epi32(-1);
  v.W = _mm_cvtsi32_si128(q.mant_bits);
  v.top = _mm_cvtsi32_si128(q.top);
  return v;
}

// The quantization of 8 elements: value (sign + mantissa field), bits (its width, 0 for a
// zero), sym (the rounded exponent field) and nz (all ones for a nonzero element).
struct Quantized8 {
  __m256i value, bits, sym, nz;
};

// Any element, any mode: the closed form of format.h with both special cases.
__attribute__((target("avx2"))) inline Quantized8 QuantizeGeneral8(__m256i u,
                                                                   const QuantVectors& v) {
  const __m256i mag = _mm256_and_si256(u, v.mag_mask);
  const __m256i e = _mm256_srl_epi32(mag, v.W);
  const __m256i is_zero =
      _mm256_cmpeq_epi32(_mm256_and_si256(u, v.zero_test), _mm256_setzero_si256());
  Quantized8 r;
  // nz = e >= zero_below && (u & zero_test) != 0
  r.nz = _mm256_andnot_si256(is_zero, _mm256_cmpgt_epi32(e, v.zero_floor));
  const __m256i drop =
      _mm256_sub_epi32(v.full, WidthOf8(e, v.offset, v.cap, v.full, v.special_above));
  const __m256i half = _mm256_srli_epi32(_mm256_sllv_epi32(v.one, drop), 1);
  const __m256i rounded =
      _mm256_and_si256(_mm256_add_epi32(mag, half), _mm256_sllv_epi32(v.all, drop));
  r.sym = _mm256_srl_epi32(rounded, v.W);
  const __m256i k2 = WidthOf8(r.sym, v.offset, v.cap, v.full, v.special_above);
  const __m256i mant =
      _mm256_srlv_epi32(_mm256_and_si256(rounded, v.mant_mask), _mm256_sub_epi32(v.full, k2));
  const __m256i sign = _mm256_sllv_epi32(_mm256_srl_epi32(u, v.top), k2);
  r.value = _mm256_and_si256(_mm256_or_si256(mant, sign), r.nz);
  r.bits = _mm256_and_si256(_mm256_add_epi32(k2, v.one), r.nz);
  return r;
}

// Near-lossless, when no nonzero element is special: every nonzero e is >= 1 (zero_below
// >= 1) and <= special_above - 1, so e and the rounded e2 <= e + 1 both take the plain
// width min(cap, max(0, s + offset)). A carry leaves a zero mantissa, which the unrounded
// drop shifts out just as well.
__attribute__((target("avx2"))) inline Quantized8 QuantizeOrdinary8(__m256i u, __m256i e,
                                                                    const QuantVectors& v) {
  const __m256i mag = _mm256_and_si256(u, v.mag_mask);
  const __m256i zero = _mm256_setzero_si256();
  Quantized8 r;
  r.nz = _mm256_cmpgt_epi32(e, v.zero_floor);  // zero_below >= 1: e >= it means mag != 0
  const __m256i k = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(e, v.offset), zero), v.cap);
  const __m256i drop = _mm256_sub_epi32(v.full, k);
  const __m256i rounded = _mm256_add_epi32(mag, _mm256_srlv_epi32(v.half_w, k));  // + 2^(drop-1)
  r.sym = _mm256_srl_epi32(rounded, v.W);
  const __m256i k2 =
      _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(r.sym, v.offset), zero), v.cap);
  const __m256i mant = _mm256_srlv_epi32(_mm256_and_si256(rounded, v.mant_mask), drop);
  const __m256i sign = _mm256_sllv_epi32(_mm256_srl_epi32(u, v.top), k2);
  r.value = _mm256_and_si256(_mm256_or_si256(mant, sign), r.nz);
  r.bits = _mm256_and_si256(_mm256_add_epi32(k2, v.one), r.nz);
  return r;
}

// Lossless: every nonzero element keeps all W mantissa bits; only +0.0 is a zero.
__attribute__((target("avx2"))) inline Quantized8 QuantizeLossless8(__m256i u,
                                                                    const QuantVectors& v) {
  Quantized8 r;
  r.nz = _mm256_xor_si256(_mm256_cmpeq_epi32(u, _mm256_setzero_si256()), v.all);
  r.sym = _mm256_srl_epi32(_mm256_and_si256(u, v.mag_mask), v.W);
  r.value = _mm256_or_si256(_mm256_and_si256(u, v.mant_mask),
                            _mm256_sll_epi32(_mm256_srl_epi32(u, v.top), v.W));
  r.bits = _mm256_and_si256(_mm256_add_epi32(v.full, v.one), r.nz);
  return r;
}

// Appends 8 fields to the plane. Fields are joined in pairs (<= 48 bits), then in fours
// when every field has <= 14 bits (near-lossless with R <= 13), and in eights (<= 64 bits)
// when every field has <= 8 bits (R <= 7, the default).
__attribute__((target("avx2,bmi2"))) inline void PutFields8(__m256i value, __m256i bits,
                                                            WordWriter& w) {
  const __m256i lo32 = _mm256_set1_epi64x(0xffffffff);
  const __m256i first = _mm256_and_si256(bits, lo32);
  const __m256i pv = _mm256_or_si256(_mm256_and_si256(value, lo32),
                                     _mm256_sllv_epi64(_mm256_srli_epi64(value, 32), first));
  const __m256i pb = _mm256_add_epi64(first, _mm256_srli_epi64(bits, 32));
  alignas(32) uint64_t tv[4], tb[4];
  const int over8 = _mm256_movemask_epi8(_mm256_cmpgt_epi32(bits, _mm256_set1_epi32(8)));
  if (__builtin_expect(over8 == 0, 1) ||
      _mm256_movemask_epi8(_mm256_cmpgt_epi32(bits, _mm256_set1_epi32(14))) == 0) {
    const __m256i qv = _mm256_or_si256(pv, _mm256_sllv_epi64(_mm256_bsrli_epi128(pv, 8), pb));
    const __m256i qb = _mm256_add_epi64(pb, _mm256_bsrli_epi128(pb, 8));
    if (__builtin_expect(over8 == 0, 1)) {  // fours of <= 32 bits in lanes 0 and 2
      const __m256i ov =
          _mm256_or_si256(qv, _mm256_sllv_epi64(_mm256_permute4x64_epi64(qv, 2), qb));
      const __m256i ob = _mm256_add_epi64(qb, _mm256_permute4x64_epi64(qb, 2));
      w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_castsi256_si128(ov))),
            static_cast<unsigned>(_mm256_cvtsi256_si32(ob)));
      return;
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(tv), qv);
    _mm256_store_si256(reinterpret_cast<__m256i*>(tb), qb);
    w.Put(tv[0], static_cast<unsigned>(tb[0]));
    w.Put(tv[2], static_cast<unsigned>(tb[2]));
    return;
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(tv), pv);
  _mm256_store_si256(reinterpret_cast<__m256i*>(tb), pb);
  for (int k = 0; k < 4; ++k) w.Put(tv[k], static_cast<unsigned>(tb[k]));
}

// Lossless f32 fields are 24 bits: whole bytes, so they are stored 3 bytes per nonzero
// element without a bit writer. Needs 16 writable bytes past the plane's end.
__attribute__((target("avx2,popcnt"))) inline uint8_t* PutTriples8(__m256i value, uint32_t m8,
                                                                   uint8_t* p) {
  const uint32_t lo = m8 & 15, hi = m8 >> 4;
  const __m128i a =
      _mm_shuffle_epi8(_mm256_castsi256_si128(value),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(kCompact.triples[lo])));
  const __m128i b =
      _mm_shuffle_epi8(_mm256_extracti128_si256(value, 1),
                       _mm_load_si128(reinterpret_cast<const __m128i*>(kCompact.triples[hi])));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), a);
  p += 3 * __builtin_popcount(lo);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b);
  return p + 3 * __builtin_popcount(hi);
}

// Byte 0 of each 32-bit lane, the lanes whose bit is set in m8 first; stored as 8 bytes.
__attribute__((target("avx2"))) inline void PutBytes8(__m256i x, uint32_t m8, uint8_t* p) {
  const __m256i low_bytes =
      _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1,
                       -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i packed = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(x, low_bytes),
                                                     _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
  const __m128i kept =
      _mm_shuffle_epi8(_mm256_castsi256_si128(packed),
                       _mm_cvtsi64_si128(static_cast<long long>(kCompact.index[m8])));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), kept);
}

enum class SplitPath { kLossless, kNearLossless, kGeneral };

template <typename U, SplitPath P>
__attribute__((target("avx2,bmi2,popcnt"))) size_t SplitAvx2Typed(const U* in, size_t n,
                                                                  const QuantParams& q,
                                                                  uint8_t* plane, uint8_t* syms,
                                                                  uint64_t* bitmap, size_t* nnz) {
  // Lossless fields of f32 (24 bits) and bf16 (8 bits) are whole bytes.
  constexpr bool kByteFields = P == SplitPath::kLossless && sizeof(U) == 4;
  const bool byte_fields16 = P == SplitPath::kLossless && q.mant_bits == 7;
  const QuantVectors v = MakeQuantVectors(q);
  uint8_t* bytes = plane;  // where byte-aligned fields go next
  WordWriter w(plane);
  Group g;
  size_t j = 0;
  for (size_t lo = 0; lo < n; lo += kGroup) {
    const size_t count = n - lo < kGroup ? n - lo : kGroup;
    uint64_t mask = 0;
    size_t i = 0;
    for (; i + 8 <= count; i += 8) {
      const __m256i u = Load8(in + lo + i);
      Quantized8 r;
      if constexpr (P == SplitPath::kLossless) {
        r = QuantizeLossless8(u, v);
      } else if constexpr (P == SplitPath::kNearLossless) {
        const __m256i e = _mm256_srl_epi32(_mm256_and_si256(u, v.mag_mask), v.W);
        if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpgt_epi32(e, v.ordinary_limit)) == 0,
                             1)) {
          r = QuantizeOrdinary8(u, e, v);
        } else {
          r = QuantizeGeneral8(u, v);
        }
      } else {
        r = QuantizeGeneral8(u, v);
      }
      const uint32_t m8 = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(r.nz)));
      mask |= uint64_t{m8} << i;
      if constexpr (kByteFields) {
        bytes = PutTriples8(r.value, m8, bytes);
      } else if (byte_fields16) {
        PutBytes8(r.value, m8, bytes);
        bytes += __builtin_popcount(m8);
      } else {
        PutFields8(r.value, r.bits, w);
      }
      PutBytes8(r.sym, m8, syms + j);
      j += static_cast<size_t>(__builtin_popcount(m8));
    }
    if (i < count) {  // the last few elements of the block
      mask |= QuantizeScalarTyped(in + lo + i, count - i, q, &g) << i;
      if (kByteFields || byte_fields16) w = WordWriter(bytes);
      PackGroupScalar(g, count - i, &w, syms, &j);
      if (kByteFields || byte_fields16) bytes += w.Finish();
    }
    bitmap[lo / kGroup] = mask;
  }
  *nnz = j;
  if (kByteFields || byte_fields16) return static_cast<size_t>(bytes - plane);
  return w.Finish();
}

// The same pass with AVX-512 (F, BW, VL, VBMI, VBMI2), 16 elements at a time, for lossless
// blocks and near-lossless blocks without special elements: mask registers replace the
// zero lanes' blends, vpcompressb packs the symbols, and with fields of <= 8 bits (R <= 7)
// eight of them go to the plane in one 64-bit put.
// GCC 12's AVX-512 headers trip its own uninitialized-value warnings (the intrinsics'
// "undefined" placeholder operands); they are not ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

template <typename U>
__attribute__((target(GCOMP_TARGET_AVX512))) inline __m512i Load16(const U* p) {
  if constexpr (sizeof(U) == 4) {
    return _mm512_loadu_si512(p);
  } else {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}

// Appends 16 fields (value, width) to the plane: in eights (<= 64 bits) when every field
// has <= 8 bits, in fours (<= 56) when <= 14, else in pairs (<= 48).
__attribute__((target(GCOMP_TARGET_AVX512))) inline void PutFields16(__m512i value, __m512i bits,
                                                                     WordWriter& w) {
  const __m512i lo32 = _mm512_set1_epi64(0xffffffff);
  const __m512i first = _mm512_and_si512(bits, lo32);
  const __m512i pv = _mm512_or_si512(_mm512_and_si512(value, lo32),
                                     _mm512_sllv_epi64(_mm512_srli_epi64(value, 32), first));
  const __m512i pb = _mm512_add_epi64(first, _mm512_srli_epi64(bits, 32));
  alignas(64) uint64_t tv[8], tb[8];
  const __mmask16 over8 = _mm512_cmpgt_epi32_mask(bits, _mm512_set1_epi32(8));
  if (__builtin_expect(over8 == 0, 1) ||
      _mm512_cmpgt_epi32_mask(bits, _mm512_set1_epi32(14)) == 0) {
    const __m512i qv = _mm512_or_si512(pv, _mm512_sllv_epi64(_mm512_bsrli_epi128(pv, 8), pb));
    const __m512i qb = _mm512_add_epi64(pb, _mm512_bsrli_epi128(pb, 8));
    if (__builtin_expect(over8 == 0, 1)) {
      // Fours in 64-bit lanes 0, 2, 4, 6 (<= 32 bits each): join 0 with 2 and 4 with 6.
      const __m512i up = _mm512_set_epi64(0, 0, 0, 6, 0, 0, 0, 2);
      const __m512i ov =
          _mm512_or_si512(qv, _mm512_sllv_epi64(_mm512_permutexvar_epi64(up, qv), qb));
      const __m512i ob = _mm512_add_epi64(qb, _mm512_permutexvar_epi64(up, qb));
      _mm512_store_si512(tv, ov);
      _mm512_store_si512(tb, ob);
      w.Put(tv[0], static_cast<unsigned>(tb[0]));
      w.Put(tv[4], static_cast<unsigned>(tb[4]));
      return;
    }
    _mm512_store_si512(tv, qv);
    _mm512_store_si512(tb, qb);
    for (int k = 0; k < 8; k += 2) w.Put(tv[k], static_cast<unsigned>(tb[k]));
    return;
  }
  _mm512_store_si512(tv, pv);
  _mm512_store_si512(tb, pb);
  for (int k = 0; k < 8; ++k) w.Put(tv[k], static_cast<unsigned>(tb[k]));
}

template <typename U, SplitPath P>
__attribute__((target(GCOMP_TARGET_AVX512))) size_t Split512Typed(const U* in, size_t n,
                                                                  const QuantParams& q,
                                                                  uint8_t* plane, uint8_t* syms,
                                                                  uint64_t* bitmap, size_t* nnz) {
  static_assert(P != SplitPath::kGeneral, "special elements take the AVX2 path");
  constexpr bool kTriples = P == SplitPath::kLossless && sizeof(U) == 4;  // 24-bit fields
  const bool bytes8 = P == SplitPath::kLossless && q.mant_bits == 7;      // 8-bit fields
  const __m512i mag_mask = _mm512_set1_epi32(static_cast<int>(q.mag_mask));
  const __m512i mant_mask = _mm512_set1_epi32(static_cast<int>(q.mant_mask));
  const __m512i zero_floor = _mm512_set1_epi32(q.zero_below - 1);
  const __m512i ordinary_limit = _mm512_set1_epi32(q.special_above - 1);
  const __m512i offset = _mm512_set1_epi32(q.width_offset);
  const __m512i cap = _mm512_set1_epi32(q.width_cap);
  const __m512i full = _mm512_set1_epi32(q.mant_bits);
  const __m512i one = _mm512_set1_epi32(1);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i half_w = _mm512_set1_epi32(1 << (q.mant_bits - 1));
  const __m128i W = _mm_cvtsi32_si128(q.mant_bits);
  const __m128i top = _mm_cvtsi32_si128(q.top);
  // Bytes 0-2 of each 32-bit lane, side by side.
  alignas(64) uint8_t triple_index[64] = {};
  for (int k = 0; k < 48; ++k) triple_index[k] = static_cast<uint8_t>(4 * (k / 3) + k % 3);
  const __m512i triples = _mm512_load_si512(triple_index);

  uint8_t* const bitmap_bytes = reinterpret_cast<uint8_t*>(bitmap);
  if (n > 0) bitmap[(n - 1) / 64] = 0;  // the tail below writes only its own bytes
  uint8_t* bytes = plane;               // where byte-aligned fields go next
  WordWriter w(plane);
  Group g;
  size_t j = 0, i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512i u = Load16(in + i);
    const __m512i mag = _mm512_and_si512(u, mag_mask);
    const __m512i e = _mm512_srl_epi32(mag, W);
    __m512i value, bits, sym;
    __mmask16 nz;
    if constexpr (P == SplitPath::kLossless) {
      nz = _mm512_test_epi32_mask(u, u);
      sym = e;
      value = _mm512_or_si512(_mm512_and_si512(u, mant_mask),
                              _mm512_sll_epi32(_mm512_srl_epi32(u, top), W));
      bits = _mm512_maskz_add_epi32(nz, full, one);
    } else {
      if (__builtin_expect(_mm512_cmpgt_epi32_mask(e, ordinary_limit) != 0, 0)) {
        // Inf/NaN or the top binade among these 16: the scalar definition.
        const uint64_t m = QuantizeScalarTyped(in + i, 16, q, &g);
        const uint16_t m16 = static_cast<uint16_t>(m);
        std::memcpy(bitmap_bytes + i / 8, &m16, 2);
        PackGroupScalar(g, 16, &w, syms, &j);
        continue;
      }
      // As QuantizeOrdinary8: zero_below >= 1, so e >= zero_below implies a nonzero.
      nz = _mm512_cmpgt_epi32_mask(e, zero_floor);
      const __m512i k = _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(e, offset), zero), cap);
      const __m512i drop = _mm512_sub_epi32(full, k);
      const __m512i rounded = _mm512_add_epi32(mag, _mm512_srlv_epi32(half_w, k));
      sym = _mm512_srl_epi32(rounded, W);
      const __m512i k2 =
          _mm512_min_epi32(_mm512_max_epi32(_mm512_add_epi32(sym, offset), zero), cap);
      const __m512i mant = _mm512_srlv_epi32(_mm512_and_si512(rounded, mant_mask), drop);
      const __m512i sign = _mm512_sllv_epi32(_mm512_srl_epi32(u, top), k2);
      value = _mm512_maskz_or_epi32(nz, mant, sign);
      bits = _mm512_maskz_add_epi32(nz, k2, one);
    }
    const uint16_t m16 = static_cast<uint16_t>(nz);
    std::memcpy(bitmap_bytes + i / 8, &m16, 2);
    const int count = __builtin_popcount(m16);
    if constexpr (kTriples) {
      const __m512i packed =
          _mm512_permutexvar_epi8(triples, _mm512_maskz_compress_epi32(nz, value));
      _mm512_mask_storeu_epi8(bytes, (uint64_t{1} << (3 * count)) - 1, packed);
      bytes += 3 * count;
    } else if (bytes8) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bytes),
                       _mm_maskz_compress_epi8(nz, _mm512_cvtepi32_epi8(value)));
      bytes += count;
    } else {
      PutFields16(value, bits, w);
    }
    _mm_storeu_si128(reinterpret_cast<__m128i*>(syms + j),
                     _mm_maskz_compress_epi8(nz, _mm512_cvtepi32_epi8(sym)));
    j += static_cast<size_t>(count);
  }
  if (i < n) {  // the last < 16 elements
    const uint64_t m = QuantizeScalarTyped(in + i, n - i, q, &g);
    const uint16_t m16 = static_cast<uint16_t>(m);
    std::memcpy(bitmap_bytes + i / 8, &m16, (n - i + 7) / 8);
    if (kTriples || bytes8) w = WordWriter(bytes);
    PackGroupScalar(g, n - i, &w, syms, &j);
    if (kTriples || bytes8) bytes += w.Finish();
  }
  *nnz = j;
  if (kTriples || bytes8) return static_cast<size_t>(bytes - plane);
  return w.Finish();
}

#pragma GCC diagnostic pop

template <typename U>
size_t SplitVector(VectorLevel level, const U* in, size_t n, const QuantParams& q, uint8_t* plane,
                   uint8_t* syms, uint64_t* bitmap, size_t* nnz) {
  const bool wide = level == VectorLevel::kAvx512;
  if (q.zero_test == ~uint32_t{0}) {  // lossless
    return wide ? Split512Typed<U, SplitPath::kLossless>(in, n, q, plane, syms, bitmap, nnz)
                : SplitAvx2Typed<U, SplitPath::kLossless>(in, n, q, plane, syms, bitmap, nnz);
  }
  if (q.zero_below >= 1) {  // no nonzero element has exponent field 0
    return wide ? Split512Typed<U, SplitPath::kNearLossless>(in, n, q, plane, syms, bitmap, nnz)
                : SplitAvx2Typed<U, SplitPath::kNearLossless>(in, n, q, plane, syms, bitmap, nnz);
  }
  return SplitAvx2Typed<U, SplitPath::kGeneral>(in, n, q, plane, syms, bitmap, nnz);
}

// Decoder tables: kExpand.rank32[m] gives, for each of 8 output lanes whose bit is set in m,
// the index of its value among the packed nonzeros; kExpand.shuffle16[m] does the same for
// 16-bit lanes as pshufb indices (0x80 = zero).
struct ExpandTables {
  uint64_t rank32[256];
  uint8_t shuffle16[256][16];
  constexpr ExpandTables() : rank32(), shuffle16() {
    for (int m = 0; m < 256; ++m) {
      int k = 0;
      for (int lane = 0; lane < 8; ++lane) {
        if (m & (1 << lane)) {
          rank32[m] |= uint64_t(k) << (8 * lane);
          shuffle16[m][2 * lane] = static_cast<uint8_t>(2 * k);
          shuffle16[m][2 * lane + 1] = static_cast<uint8_t>(2 * k + 1);
          ++k;
        } else {
          shuffle16[m][2 * lane] = shuffle16[m][2 * lane + 1] = 0x80;
        }
      }
    }
  }
};
constexpr ExpandTables kExpand;

struct JoinVectors {
  __m256i offset, cap, full, special_above, one, narrow;
  __m128i W, top;
};

// How the fields of 8 elements are read: 3 whole bytes each (lossless f32), 1 byte each
// (lossless bf16), or any widths.
enum class FieldPath { kTriples, kBytes, kBits };

// 8 nonzero elements from their symbols and the plane at bit *pos, which advances. Needs
// (*pos >> 3) + 32 <= plane size (the widest 8 fields, 192 bits, plus an 8-byte load).
template <FieldPath P>
__attribute__((always_inline, target("avx2,bmi2"))) inline __m256i Join8(const uint8_t* syms,
                                                                         const uint8_t* plane,
                                                                         uint64_t* pos,
                                                                         const JoinVectors& v) {
  const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(syms)));
  const __m256i k = WidthOf8(s, v.offset, v.cap, v.full, v.special_above);
  const __m256i w = _mm256_add_epi32(k, v.one);
  __m256i f;
  if constexpr (P == FieldPath::kTriples) {
    const __m128i expand = _mm_setr_epi8(0, 1, 2, -1, 3, 4, 5, -1, 6, 7, 8, -1, 9, 10, 11, -1);
    const uint8_t* p = plane + (*pos >> 3);
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 12));
    f = _mm256_set_m128i(_mm_shuffle_epi8(b, expand), _mm_shuffle_epi8(a, expand));
    *pos += 8 * 24;
  } else if constexpr (P == FieldPath::kBytes) {
    f = _mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(plane + (*pos >> 3))));
    *pos += 8 * 8;
  } else {
    // Bit offsets of the fields: an exclusive prefix sum of the widths.
    __m256i incl = _mm256_add_epi32(w, _mm256_slli_si256(w, 4));
    incl = _mm256_add_epi32(incl, _mm256_slli_si256(incl, 8));
    incl = _mm256_add_epi32(
        incl, _mm256_and_si256(
                  _mm256_permutevar8x32_epi32(incl, _mm256_setr_epi32(0, 0, 0, 0, 3, 3, 3, 3)),
                  _mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1)));
    const __m256i excl = _mm256_sub_epi32(incl, w);
    alignas(32) uint32_t at[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(at), incl);
    const uint64_t pa = *pos, pb = pa + at[3];
    if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpgt_epi32(w, v.narrow)) == 0, 1)) {
      // Fields of <= 14 bits: 4 of them (<= 56 bits) from each of two 8-byte loads.
      const uint64_t xa = Load64(plane + (pa >> 3)) >> (pa & 7);
      const uint64_t xb = Load64(plane + (pb >> 3)) >> (pb & 7);
      const __m256i ea = _mm256_cvtepu32_epi64(_mm256_castsi256_si128(excl));
      const __m256i eb = _mm256_cvtepu32_epi64(_mm_sub_epi32(
          _mm256_extracti128_si256(excl, 1), _mm_set1_epi32(static_cast<int>(at[3]))));
      const __m256i fa = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(xa)), ea);
      const __m256i fb = _mm256_srlv_epi64(_mm256_set1_epi64x(static_cast<int64_t>(xb)), eb);
      f = _mm256_blend_epi32(
          _mm256_permutevar8x32_epi32(fa, _mm256_setr_epi32(0, 2, 4, 6, 0, 0, 0, 0)),
          _mm256_permutevar8x32_epi32(fb, _mm256_setr_epi32(0, 0, 0, 0, 0, 2, 4, 6)), 0xf0);
    } else {
      alignas(32) uint32_t off[8], field[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(off), excl);
      for (int t = 0; t < 8; ++t) {
        const uint64_t p = pa + off[t];
        field[t] = static_cast<uint32_t>(Load64(plane + (p >> 3)) >> (p & 7));
      }
      f = _mm256_load_si256(reinterpret_cast<const __m256i*>(field));
    }
    *pos += at[7];  // bits above a field's width are masked off below
  }
  const __m256i mant = _mm256_and_si256(f, _mm256_sub_epi32(_mm256_sllv_epi32(v.one, k), v.one));
  const __m256i sign = _mm256_and_si256(_mm256_srlv_epi32(f, k), v.one);
  return _mm256_or_si256(_mm256_or_si256(_mm256_sll_epi32(sign, v.top), _mm256_sll_epi32(s, v.W)),
                         _mm256_sllv_epi32(mant, _mm256_sub_epi32(v.full, k)));
}

template <typename U>
__attribute__((target("avx2"))) inline void Store8(uint8_t* out, __m256i x) {
  if constexpr (sizeof(U) == 4) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), x);
  } else {  // 8 x u32 (each < 2^16) -> 8 x u16, in order
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1)));
  }
}

// Elements are rebuilt in chunks: the nonzeros of a chunk into a small buffer, then spread
// out by the bitmap (or written in place when the chunk has no zeros).
constexpr size_t kJoinChunk = 2048;

// Decodes the next m nonzeros (from syms[*j], the plane at bit *pos) to dst (room for m + 8).
template <typename U, FieldPath P>
__attribute__((target("avx2,bmi2"))) void DecodeRun(const uint8_t* syms, const uint8_t* plane,
                                                    size_t size, const QuantParams& q,
                                                    const JoinVectors& v, uint64_t* pos, size_t* j,
                                                    uint8_t* dst, size_t m) {
  uint64_t at = *pos;  // locals: no store and reload between iterations
  const uint8_t* s = syms + *j;
  size_t i = 0;
  for (; i + 8 <= m && (at >> 3) + 32 <= size; i += 8) {
    Store8<U>(dst + i * sizeof(U), Join8<P>(s + i, plane, &at, v));
  }
  size_t next = *j + i;
  for (; i < m; ++i) PutElem<U>(dst, i, NextElement<U>(syms, &next, plane, size, &at, q));
  *j += m;
  *pos = at;
}

template <typename U, FieldPath P>
__attribute__((target("avx2,bmi2,popcnt"))) absl::Status JoinAvx2Typed(
    const uint8_t* syms, size_t nnz, const uint8_t* plane, size_t size, const QuantParams& q,
    const uint64_t* bitmap, size_t n, uint8_t* out) {
  JoinVectors v;
  v.offset = _mm256_set1_epi32(q.width_offset);
  v.cap = _mm256_set1_epi32(q.width_cap);
  v.full = _mm256_set1_epi32(q.mant_bits);
  v.special_above = _mm256_set1_epi32(q.special_above);
  v.one = _mm256_set1_epi32(1);
  v.narrow = _mm256_set1_epi32(14);
  v.W = _mm_cvtsi32_si128(q.mant_bits);
  v.top = _mm_cvtsi32_si128(q.top);
  uint64_t pos = 0;
  size_t j = 0;
  alignas(32) U buf[kJoinChunk + 8];
  uint8_t* const packed = reinterpret_cast<uint8_t*>(buf);
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (size_t lo = 0; lo < n; lo += kJoinChunk) {
    const size_t cnt = n - lo < kJoinChunk ? n - lo : kJoinChunk;
    uint8_t* dst = out + lo * sizeof(U);
    if (bitmap == nullptr) {
      DecodeRun<U, P>(syms, plane, size, q, v, &pos, &j, dst, cnt);
      continue;
    }
    const uint64_t* words = bitmap + lo / 64;
    size_t m = 0;
    for (size_t w = 0; w * 64 < cnt; ++w) m += static_cast<size_t>(__builtin_popcountll(words[w]));
    if (m == cnt) {
      DecodeRun<U, P>(syms, plane, size, q, v, &pos, &j, dst, cnt);
      continue;
    }
    DecodeRun<U, P>(syms, plane, size, q, v, &pos, &j, packed, m);
    size_t k = 0, g = 0;
    for (; g + 8 <= cnt; g += 8) {
      const uint32_t m8 = static_cast<uint32_t>(words[g / 64] >> (g % 64)) & 0xff;
      if constexpr (sizeof(U) == 4) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(buf + k));
        const __m256i rank =
            _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(kExpand.rank32[m8])));
        const __m256i keep = _mm256_cmpeq_epi32(
            _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(m8)), lane_bit), lane_bit);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + g * 4),
                            _mm256_and_si256(_mm256_permutevar8x32_epi32(x, rank), keep));
      } else {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(buf + k));
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(dst + g * 2),
            _mm_shuffle_epi8(
                x, _mm_load_si128(reinterpret_cast<const __m128i*>(kExpand.shuffle16[m8]))));
      }
      k += static_cast<size_t>(__builtin_popcount(m8));
    }
    for (; g < cnt; ++g) {
      const bool nonzero = (words[g / 64] >> (g % 64)) & 1;
      PutElem<U>(dst, g, nonzero ? buf[k] : U{0});
      k += nonzero;
    }
  }
  return CheckPlaneEnd(plane, size, pos);
}

template <typename U>
absl::Status JoinAvx2(const uint8_t* syms, size_t nnz, const uint8_t* plane, size_t size,
                      const QuantParams& q, const uint64_t* bitmap, size_t n, uint8_t* out) {
  const bool lossless = q.zero_test == ~uint32_t{0};
  if (lossless && q.mant_bits == 23) {
    return JoinAvx2Typed<U, FieldPath::kTriples>(syms, nnz, plane, size, q, bitmap, n, out);
  }
  if (lossless && q.mant_bits == 7) {
    return JoinAvx2Typed<U, FieldPath::kBytes>(syms, nnz, plane, size, q, bitmap, n, out);
  }
  return JoinAvx2Typed<U, FieldPath::kBits>(syms, nnz, plane, size, q, bitmap, n, out);
}

#endif  // __x86_64__

}  // namespace

int MaxFiniteExponentScalar(DType dtype, const void* in, size_t n) {
  const FloatBits lay = FloatBitsOf(dtype);
  const uint32_t mag_mask = (uint32_t{1} << (lay.total_bits - 1)) - 1;
  const uint32_t inf = static_cast<uint32_t>(lay.all_ones()) << lay.mant_bits;
  const uint32_t mag = dtype == DType::kF32
                           ? MaxFiniteMagScalar(static_cast<const uint32_t*>(in), n, mag_mask, inf)
                           : MaxFiniteMagScalar(static_cast<const uint16_t*>(in), n, mag_mask, inf);
  return static_cast<int>(mag >> lay.mant_bits);
}

int MaxFiniteExponent(DType dtype, const void* in, size_t n) {
#if defined(__x86_64__)
  if (MaxVectorLevel() >= VectorLevel::kAvx2) {
    const FloatBits lay = FloatBitsOf(dtype);
    const uint32_t mag_mask = (uint32_t{1} << (lay.total_bits - 1)) - 1;
    const uint32_t inf = static_cast<uint32_t>(lay.all_ones()) << lay.mant_bits;
    const uint32_t mag = dtype == DType::kF32
                             ? MaxFiniteMagAvx2(static_cast<const uint32_t*>(in), n, mag_mask, inf)
                             : MaxFiniteMagAvx2(static_cast<const uint16_t*>(in), n, mag_mask, inf);
    return static_cast<int>(mag >> lay.mant_bits);
  }
#endif
  return MaxFiniteExponentScalar(dtype, in, n);
}

absl::Status JoinElementsScalar(DType dtype, const uint8_t* syms, size_t nnz,
                                absl::Span<const uint8_t> plane, const QuantParams& q,
                                const uint64_t* bitmap, size_t n, void* out) {
  uint8_t* o = static_cast<uint8_t*>(out);
  if (dtype == DType::kF32) {
    return JoinScalarTyped<uint32_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o);
  }
  return JoinScalarTyped<uint16_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o);
}

absl::Status JoinElements(DType dtype, const uint8_t* syms, size_t nnz,
                          absl::Span<const uint8_t> plane, const QuantParams& q,
                          const uint64_t* bitmap, size_t n, void* out) {
#if defined(__x86_64__)
  if (MaxVectorLevel() >= VectorLevel::kAvx2) {
    uint8_t* o = static_cast<uint8_t*>(out);
    if (dtype == DType::kF32) {
      return JoinAvx2<uint32_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o);
    }
    return JoinAvx2<uint16_t>(syms, nnz, plane.data(), plane.size(), q, bitmap, n, o);
  }
#endif
  return JoinElementsScalar(dtype, syms, nnz, plane, q, bitmap, n, out);
}

size_t SplitElementsScalar(DType dtype, const void* in, size_t n, const QuantParams& q,
                           uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz) {
  if (dtype == DType::kF32) {
    return SplitScalarTyped(static_cast<const uint32_t*>(in), n, q, plane, syms, bitmap, nnz);
  }
  return SplitScalarTyped(static_cast<const uint16_t*>(in), n, q, plane, syms, bitmap, nnz);
}

size_t SplitElementsAt(VectorLevel level, DType dtype, const void* in, size_t n,
                       const QuantParams& q, uint8_t* plane, uint8_t* syms, uint64_t* bitmap,
                       size_t* nnz) {
#if defined(__x86_64__)
  if (level > MaxVectorLevel()) level = MaxVectorLevel();
  if (level != VectorLevel::kScalar) {
    if (dtype == DType::kF32) {
      return SplitVector(level, static_cast<const uint32_t*>(in), n, q, plane, syms, bitmap, nnz);
    }
    return SplitVector(level, static_cast<const uint16_t*>(in), n, q, plane, syms, bitmap, nnz);
  }
#endif
  return SplitElementsScalar(dtype, in, n, q, plane, syms, bitmap, nnz);
}

size_t SplitElements(DType dtype, const void* in, size_t n, const QuantParams& q, uint8_t* plane,
                     uint8_t* syms, uint64_t* bitmap, size_t* nnz) {
  return SplitElementsAt(MaxVectorLevel(), dtype, in, n, q, plane, syms, bitmap, nnz);
}

}  // namespace gcomp::codec::internal
