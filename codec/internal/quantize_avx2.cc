// The encoder's element pass with AVX2 (and BMI2, POPCNT), 8 elements a step in 32-bit
// lanes for every policy, and 16 or 32 a step in 16-bit lanes where near-lossless fields have
// at most 8 bits (joined by PEXT where cpu.h's FastPext() holds, else by shifts); and the
// largest finite exponent. Each function carries its target attribute, so
// this file builds for any x86-64 CPU and its code runs only where cpu.cc found AVX2.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "codec/internal/bits.h"
#include "codec/internal/quantize.h"
#include "codec/internal/quantize_kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>

namespace gcomp::codec::internal {
namespace {

template <typename U>
__attribute__((target("avx2"))) inline __m256i Load8(const U* p) {
  if constexpr (sizeof(U) == 4) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}

// The largest of mag_of(x) over in[0, n - n % 8), in four chains (the max's latency is not
// the bound).
template <typename U, typename MagOf>
__attribute__((target("avx2"), always_inline)) inline uint32_t MaxOfAvx2(const U* in, size_t n,
                                                                         MagOf mag_of) {
  __m256i b0 = _mm256_setzero_si256(), b1 = b0, b2 = b0, b3 = b0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    b0 = _mm256_max_epu32(b0, mag_of(Load8(in + i)));
    b1 = _mm256_max_epu32(b1, mag_of(Load8(in + i + 8)));
    b2 = _mm256_max_epu32(b2, mag_of(Load8(in + i + 16)));
    b3 = _mm256_max_epu32(b3, mag_of(Load8(in + i + 24)));
  }
  for (; i + 8 <= n; i += 8) b0 = _mm256_max_epu32(b0, mag_of(Load8(in + i)));
  const __m256i best = _mm256_max_epu32(_mm256_max_epu32(b0, b1), _mm256_max_epu32(b2, b3));
  alignas(32) uint32_t lanes[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), best);
  uint32_t result = 0;
  for (uint32_t lane : lanes) result = lane > result ? lane : result;
  return result;
}

// The largest magnitude below `inf` (all ones exponent) among in[0, n). One pass of plain
// maxima first: nearly every block has no Inf or NaN, and then that maximum is the answer.
// Only a block that holds one takes a second pass that masks them out.
template <typename U>
__attribute__((target("avx2"))) uint32_t MaxFiniteMagAvx2(const U* in, size_t n, uint32_t mag_mask,
                                                          uint32_t inf) {
  const __m256i mm = _mm256_set1_epi32(static_cast<int>(mag_mask));
  const __m256i limit = _mm256_set1_epi32(static_cast<int>(inf));
  uint32_t result = MaxOfAvx2(
      in, n, [mm](__m256i x) __attribute__((target("avx2"))) { return _mm256_and_si256(x, mm); });
  if (result >= inf) {
    // mag < inf (both below 2^31, so the signed compare is exact)
    result = MaxOfAvx2(
        in, n, [ mm, limit ](__m256i x) __attribute__((target("avx2"))) {
          const __m256i mag = _mm256_and_si256(x, mm);
          return _mm256_and_si256(mag, _mm256_cmpgt_epi32(limit, mag));
        });
  }
  const size_t vector_part = n - n % 8;
  const uint32_t tail = MaxFiniteMagScalar(in + vector_part, n - vector_part, mag_mask, inf);
  return tail > result ? tail : result;
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
  // zero_floor: the ordinary forms' zero_below - 1; general_floor: the block's own.
  __m256i mag_mask, mant_mask, zero_test, zero_floor, general_floor, offset, cap, full,
      special_above, ordinary_limit, half_w, one, all, sign32;
  // For the 32-element shift join (QuantizeNarrow16, PutNarrow32).
  __m256i one16, lo16, order;
  // For QuantizeOrdinary16, in 16-bit lanes: the width's offset, floor and cap raised by 8
  // (so that a width indexes the upper half of a byte table), the zero and special limits,
  // and the byte tables 2^(7 - k), 2^k and a byte's top k + 1 bits at index 8 + k (0 at
  // index 0).
  __m256i offset8_16, eight16, cap8_16, seven16, zero_below16, ordinary_limit16, low_byte16,
      bit8_16, half_by_k, pow_by_k, keep_by_k;
  __m128i W, top, to_bit23, x_shift16;
};
// `ordinary_zero_below`: the zero_below the ordinary forms take (see SplitAvx2Typed's
// kSubnormals); the general form takes q's.
__attribute__((target("avx2"))) inline QuantVectors MakeQuantVectors(const QuantParams& q,
                                                                     int ordinary_zero_below) {
  QuantVectors v;
  v.mag_mask = _mm256_set1_epi32(static_cast<int>(q.mag_mask));
  v.mant_mask = _mm256_set1_epi32(static_cast<int>(q.mant_mask));
  v.zero_test = _mm256_set1_epi32(static_cast<int>(q.zero_test));
  v.zero_floor = _mm256_set1_epi32(ordinary_zero_below - 1);
  v.general_floor = _mm256_set1_epi32(q.zero_below - 1);
  v.offset = _mm256_set1_epi32(q.width_offset);
  v.cap = _mm256_set1_epi32(q.width_cap);
  v.full = _mm256_set1_epi32(q.mant_bits);
  v.special_above = _mm256_set1_epi32(q.special_above);
  v.ordinary_limit = _mm256_set1_epi32(q.special_above - 1);
  v.half_w = _mm256_set1_epi32(1 << (q.mant_bits - 1));
  v.one = _mm256_set1_epi32(1);
  v.all = _mm256_set1_epi32(-1);
  v.sign32 = _mm256_set1_epi32(INT32_MIN);
  v.one16 = _mm256_set1_epi16(1);
  v.lo16 = _mm256_set1_epi32(0xffff);
  // The packs leave 32-bit units [a0-3 b0-3 c0-3 d0-3 | a4-7 ...]: this puts them in order.
  v.order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  // e is at most 255, so offsets and limits beyond these bounds give the same results.
  const auto clamp16 = [](int x, int lo, int hi) {
    return static_cast<int16_t>(x < lo ? lo : x > hi ? hi : x);
  };
  v.offset8_16 = _mm256_set1_epi16(clamp16(q.width_offset + 8, -512, 512));
  v.eight16 = _mm256_set1_epi16(8);
  v.cap8_16 = _mm256_set1_epi16(clamp16(q.width_cap + 8, 8, 15));
  v.seven16 = _mm256_set1_epi16(7);
  v.zero_below16 = _mm256_set1_epi16(clamp16(ordinary_zero_below, 0, 256));
  v.ordinary_limit16 = _mm256_set1_epi16(clamp16(q.special_above - 1, -1, 256));
  v.low_byte16 = _mm256_set1_epi16(0xff);
  v.bit8_16 = _mm256_set1_epi16(0x100);
  v.half_by_k = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, -128, 64, 32, 16, 8, 4, 2, 1, 0, 0, 0, 0,
                                 0, 0, 0, 0, -128, 64, 32, 16, 8, 4, 2, 1);
  v.pow_by_k = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 4, 8, 16, 32, 64, -128, 0, 0, 0, 0, 0,
                                0, 0, 0, 1, 2, 4, 8, 16, 32, 64, -128);
  v.keep_by_k = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, -128, -64, -32, -16, -8, -4, -2, -1, 0, 0,
                                 0, 0, 0, 0, 0, 0, -128, -64, -32, -16, -8, -4, -2, -1);
  v.W = _mm_cvtsi32_si128(q.mant_bits);
  v.top = _mm_cvtsi32_si128(q.top);
  v.to_bit23 = _mm_cvtsi32_si128(23 - q.mant_bits);
  // A 16-bit float's magnitude, shifted up by 1, to its exponent over 8 mantissa bits.
  v.x_shift16 = _mm_cvtsi32_si128(q.mant_bits > 7 ? q.mant_bits - 7 : 0);
  return v;
}

// The exponent fields of 8 elements.
__attribute__((target("avx2"), always_inline)) inline __m256i Exponents8(__m256i u,
                                                                         const QuantVectors& v) {
  return _mm256_srl_epi32(_mm256_and_si256(u, v.mag_mask), v.W);
}

// Lanes of 8 elements (u, exponent fields e) that the ordinary forms below cannot take: Inf,
// NaN and the largest finite field (e > special_above - 1), and with kSubnormals the
// nonzero elements of field 0, which keep W bits where a block's floor reaches below the
// normal range (f16 blocks whose largest magnitude is under 4 at the default A).
template <bool kSubnormals>
__attribute__((target("avx2"), always_inline)) inline __m256i NotOrdinary8(__m256i u, __m256i e,
                                                                           const QuantVectors& v) {
  const __m256i above = _mm256_cmpgt_epi32(e, v.ordinary_limit);
  if constexpr (!kSubnormals) return above;
  const __m256i zero = _mm256_setzero_si256();
  const __m256i subnormal = _mm256_andnot_si256(
      _mm256_cmpeq_epi32(_mm256_and_si256(u, v.mag_mask), zero), _mm256_cmpeq_epi32(e, zero));
  return _mm256_or_si256(above, subnormal);
}

// The quantization of 8 elements: value (sign + mantissa field), bits (its width, 0 for a
// zero), sym (the rounded exponent field) and nz (all ones for a nonzero element).
struct Quantized8 {
  __m256i value, bits, sym, nz;
};

// Any element, any mode: the closed form of format.h with both special cases.
__attribute__((target("avx2"), always_inline)) inline Quantized8 QuantizeGeneral8(
    __m256i u, const QuantVectors& v) {
  const __m256i mag = _mm256_and_si256(u, v.mag_mask);
  const __m256i e = _mm256_srl_epi32(mag, v.W);
  const __m256i is_zero =
      _mm256_cmpeq_epi32(_mm256_and_si256(u, v.zero_test), _mm256_setzero_si256());
  Quantized8 r;
  // nz = e >= zero_below && (u & zero_test) != 0
  r.nz = _mm256_andnot_si256(is_zero, _mm256_cmpgt_epi32(e, v.general_floor));
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
template <typename U>
__attribute__((target("avx2"), always_inline)) inline Quantized8 QuantizeOrdinary8(
    __m256i u, __m256i e, const QuantVectors& v) {
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
  // f32's sign is bit 31: a shift by an immediate leaves a register free.
  const __m256i sign_bit = sizeof(U) == 4 ? _mm256_srli_epi32(u, 31) : _mm256_srl_epi32(u, v.top);
  const __m256i sign = _mm256_sllv_epi32(sign_bit, k2);
  r.value = _mm256_and_si256(_mm256_or_si256(mant, sign), r.nz);
  r.bits = _mm256_and_si256(_mm256_add_epi32(k2, v.one), r.nz);
  return r;
}

// Lossless: every nonzero element keeps all W mantissa bits; only +0.0 is a zero.
__attribute__((target("avx2"))) inline Quantized8 QuantizeLossless8(__m256i u,
                                                                    const QuantVectors& v) {
  Quantized8 r;
  r.nz = _mm256_xor_si256(_mm256_cmpeq_epi32(u, _mm256_setzero_si256()), v.all);
  r.sym = Exponents8(u, v);
  r.value = _mm256_or_si256(_mm256_and_si256(u, v.mant_mask),
                            _mm256_sll_epi32(_mm256_srl_epi32(u, v.top), v.W));
  r.bits = _mm256_and_si256(_mm256_add_epi32(v.full, v.one), r.nz);
  return r;
}

// Fields joined in pairs: values (<= 48 bits) and widths in 64-bit lanes.
struct Pairs4 {
  __m256i value, bits;
};
__attribute__((target("avx2"), always_inline)) inline Pairs4 JoinPairs(__m256i value,
                                                                       __m256i bits) {
  const __m256i lo32 = _mm256_set1_epi64x(0xffffffff);
  const __m256i first = _mm256_and_si256(bits, lo32);
  return {_mm256_or_si256(_mm256_and_si256(value, lo32),
                          _mm256_sllv_epi64(_mm256_srli_epi64(value, 32), first)),
          _mm256_add_epi64(first, _mm256_srli_epi64(bits, 32))};
}

// Pairs joined in fours, left in lanes 0 and 2.
__attribute__((target("avx2"), always_inline)) inline Pairs4 JoinFours(Pairs4 p) {
  return {_mm256_or_si256(p.value, _mm256_sllv_epi64(_mm256_bsrli_epi128(p.value, 8), p.bits)),
          _mm256_add_epi64(p.bits, _mm256_bsrli_epi128(p.bits, 8))};
}

// Appends 8 fields of <= 8 bits each, joined in one piece of <= 64 bits.
__attribute__((target("avx2,bmi2"), always_inline)) inline void PutEights(Pairs4 p, WordWriter& w) {
  const Pairs4 q = JoinFours(p);
  const __m256i ov =
      _mm256_or_si256(q.value, _mm256_sllv_epi64(_mm256_permute4x64_epi64(q.value, 2), q.bits));
  const __m256i ob = _mm256_add_epi64(q.bits, _mm256_permute4x64_epi64(q.bits, 2));
  w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_castsi256_si128(ov))),
        static_cast<unsigned>(_mm256_cvtsi256_si32(ob)));
}

// Appends 8 fields of <= 14 bits, joined in two fours (<= 56 bits each).
__attribute__((target("avx2,bmi2"), always_inline)) inline void PutFours(Pairs4 p, WordWriter& w) {
  const Pairs4 q = JoinFours(p);
  w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(_mm256_castsi256_si128(q.value))),
        static_cast<unsigned>(_mm256_cvtsi256_si32(q.bits)));
  const __m128i hv = _mm256_extracti128_si256(q.value, 1);
  const __m128i hb = _mm256_extracti128_si256(q.bits, 1);
  w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(hv)), static_cast<unsigned>(_mm_cvtsi128_si32(hb)));
}

// Appends 8 fields to the plane. Fields are joined in pairs (<= 48 bits), then in fours
// when every field has <= 14 bits (near-lossless with R <= 13), and in eights (<= 64 bits)
// when every field has <= 8 bits (R <= 7, the default). `U`: the elements' storage; a
// 16-bit float's fields have at most 11 bits, so they are always joined in fours, with no
// branch to mispredict where fields of 9-11 bits (f16 subnormals) and narrower ones mix.
template <typename U>
__attribute__((target("avx2,bmi2"), always_inline)) inline void PutFields8(__m256i value,
                                                                           __m256i bits,
                                                                           WordWriter& w) {
  const Pairs4 p = JoinPairs(value, bits);
  if constexpr (sizeof(U) == 2) {
    PutFours(p, w);
    return;
  }
  const __m256i pv = p.value, pb = p.bits;
  alignas(32) uint64_t tv[4], tb[4];
  if (__builtin_expect(_mm256_movemask_epi8(_mm256_cmpgt_epi32(bits, _mm256_set1_epi32(8))) == 0,
                       1)) {
    PutEights(p, w);
    return;
  }
  if (_mm256_movemask_epi8(_mm256_cmpgt_epi32(bits, _mm256_set1_epi32(14))) == 0) {
    PutFours(p, w);
    return;
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(tv), pv);
  _mm256_store_si256(reinterpret_cast<__m256i*>(tb), pb);
  for (int k = 0; k < 4; ++k) w.Put(tv[k], static_cast<unsigned>(tb[k]));
}

// Near-lossless, ordinary elements (as QuantizeOrdinary8) whose fields have at most 8 bits
// (width_cap <= 7), appended to the plane with PEXT. Each element's field is the top
// k2 + 1 bits of a byte B = (sign, the 7 top mantissa bits of the rounded magnitude): byte 2
// of each lane holds B, byte 3 the mask of its top k2 + 1 bits (none for a zero), and PEXT
// keeps the masked bits in order. When rounding carries into the exponent (k2 = k + 1) the
// rounded mantissa's bits from drop - 1 up are zero, so B's extra bit reads right. Returns
// the nonzero mask; sym gets the rounded exponent fields.
template <typename U>
__attribute__((target("avx2,bmi2,popcnt"), always_inline)) inline __m256i PutOrdinaryBytes8(
    __m256i u, __m256i e, const QuantVectors& v, WordWriter& w, __m256i* sym) {
  const __m256i mag = _mm256_and_si256(u, v.mag_mask);
  const __m256i zero = _mm256_setzero_si256();
  const __m256i nz = _mm256_cmpgt_epi32(e, v.zero_floor);
  const __m256i k = _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(e, v.offset), zero), v.cap);
  const __m256i rounded = _mm256_add_epi32(mag, _mm256_srlv_epi32(v.half_w, k));
  *sym = _mm256_srl_epi32(rounded, v.W);
  const __m256i k2 =
      _mm256_min_epi32(_mm256_max_epi32(_mm256_add_epi32(*sym, v.offset), zero), v.cap);
  // sign at bit W, just above the mantissa; then (for 16-bit floats) up to bit 23.
  __m256i y = _mm256_or_si256(_mm256_and_si256(rounded, v.mant_mask),
                              _mm256_sll_epi32(_mm256_srl_epi32(u, v.top), v.W));
  if constexpr (sizeof(U) == 2) y = _mm256_sll_epi32(y, v.to_bit23);
  const __m256i keep = _mm256_and_si256(_mm256_srav_epi32(v.sign32, k2), nz);
  const __m256i by_lane = _mm256_shuffle_epi8(
      _mm256_or_si256(y, keep),
      _mm256_setr_epi8(2, 6, 10, 14, 3, 7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 6, 10, 14, 3,
                       7, 11, 15, -1, -1, -1, -1, -1, -1, -1, -1));
  const __m128i both = _mm256_castsi256_si128(
      _mm256_permutevar8x32_epi32(by_lane, _mm256_setr_epi32(0, 4, 1, 5, 0, 0, 0, 0)));
  const uint64_t bytes = static_cast<uint64_t>(_mm_cvtsi128_si64(both));
  const uint64_t mask = static_cast<uint64_t>(_mm_extract_epi64(both, 1));
  w.Put(_pext_u64(bytes, mask), static_cast<unsigned>(__builtin_popcountll(mask)));
  return nz;
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

// Two groups of 8 bytes (the halves of x), each group's bytes whose bit is set in its byte of
// m16 first, appended at syms + *j. Needs 8 writable bytes past the last.
__attribute__((target("avx2,popcnt"), always_inline)) inline void PutBytes16(__m128i x,
                                                                             uint32_t m16,
                                                                             uint8_t* syms,
                                                                             size_t* j) {
  // The second group reads bytes 8-15: its indices get bit 3 (0xff, "write zero", keeps its
  // top bit).
  constexpr uint64_t kHigh = 0x0808080808080808;
  const uint32_t m_lo = m16 & 0xff, m_hi = m16 >> 8;
  const __m128i kept =
      _mm_shuffle_epi8(x, _mm_set_epi64x(static_cast<long long>(kCompact.index[m_hi] | kHigh),
                                         static_cast<long long>(kCompact.index[m_lo])));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(syms + *j), kept);
  *j += static_cast<size_t>(__builtin_popcount(m_lo));
  // The high half through storel (unaligned-safe): storeh_pd is a double store.
  _mm_storel_epi64(reinterpret_cast<__m128i*>(syms + *j), _mm_unpackhi_epi64(kept, kept));
  *j += static_cast<size_t>(__builtin_popcount(m_hi));
}

// The ordinary forms (QuantizeOrdinary8) of 16 elements in 16-bit lanes, where every field
// has at most 8 bits (width_cap <= 7). The rounding then adds at the 8th mantissa bit or
// above, so x, the exponent field e over the top 8 mantissa bits (7 and a zero for bf16),
// decides everything: the rounded x is x + 2^(7 - k), its high byte is the symbol, and the
// field is y >> (8 - k2), y being the sign above the rounded x's low byte. AVX2 has no
// variable 16-bit shifts: 2^(7 - k) comes from a byte table. Lanes are [a0-3 b0-3 | a4-7
// b4-7] for the groups a and b of 8 elements, the order packs from 32-bit lanes leave.
struct Ordinary16 {
  __m256i zero;     // all ones for a zero
  __m256i y;        // the sign (bit 8) and the rounded mantissa's top 8 bits
  __m256i sym;      // the rounded exponent fields
  __m256i k2_8;     // 8 + the width of the rounded element
  __m256i special;  // nonzero where an element is not ordinary (see NotOrdinary8)
};
template <typename U, bool kSubnormals>
__attribute__((target("avx2"), always_inline)) inline Ordinary16 QuantizeOrdinary16(
    const U* in, const QuantVectors& v) {
  __m256i x, signs, subnormal = _mm256_setzero_si256();
  if constexpr (sizeof(U) == 4) {
    const __m256i ua = Load8(in), ub = Load8(in + 8);
    x = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_slli_epi32(ua, 1), 16),
                            _mm256_srli_epi32(_mm256_slli_epi32(ub, 1), 16));
    // Signed saturation keeps the sign: bit 15 of each lane is the element's.
    signs = _mm256_packs_epi32(ua, ub);
    // A subnormal's nonzero bits may all lie below x: test the whole elements.
    if constexpr (kSubnormals) {
      subnormal = _mm256_or_si256(NotOrdinary8<true>(ua, Exponents8(ua, v), v),
                                  NotOrdinary8<true>(ub, Exponents8(ub, v), v));
    }
  } else {
    // 64-bit quarters [0-3 4-7 8-11 12-15] to [0-3 8-11 | 4-7 12-15].
    signs =
        _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(in)), 0xd8);
    const __m256i mag2 = _mm256_slli_epi16(signs, 1);
    x = _mm256_srl_epi16(mag2, v.x_shift16);
    if constexpr (kSubnormals) {
      subnormal =
          _mm256_andnot_si256(_mm256_cmpeq_epi16(mag2, _mm256_setzero_si256()),
                              _mm256_cmpeq_epi16(_mm256_srli_epi16(x, 8), _mm256_setzero_si256()));
    }
  }
  Ordinary16 o;
  const __m256i e = _mm256_srli_epi16(x, 8);
  o.zero = _mm256_cmpgt_epi16(v.zero_below16, e);
  o.special = _mm256_or_si256(_mm256_cmpgt_epi16(e, v.ordinary_limit16), subnormal);
  const __m256i k8 =
      _mm256_min_epi16(_mm256_max_epi16(_mm256_add_epi16(e, v.offset8_16), v.eight16), v.cap8_16);
  // Below the largest finite field x + 2^7 stays within 16 bits; a larger e is special.
  const __m256i rounded = _mm256_add_epi16(x, _mm256_shuffle_epi8(v.half_by_k, k8));
  o.sym = _mm256_srli_epi16(rounded, 8);
  o.k2_8 = _mm256_min_epi16(_mm256_max_epi16(_mm256_add_epi16(o.sym, v.offset8_16), v.eight16),
                            v.cap8_16);
  o.y = _mm256_or_si256(_mm256_and_si256(rounded, v.low_byte16),
                        _mm256_and_si256(_mm256_srli_epi16(signs, 7), v.bit8_16));
  return o;
}

// The zero-map bytes (at map) and the nonzero symbols (at syms + *j) of an Ordinary16.
__attribute__((target("avx2,popcnt"), always_inline)) inline void PutMapAndSymbols16(
    const Ordinary16& o, const QuantVectors& v, uint8_t* map, uint8_t* syms, size_t* j) {
  const uint32_t m16 = ~static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_permutevar8x32_epi32(
                           _mm256_packs_epi16(o.zero, o.zero), v.order))) &
                       0xffff;
  std::memcpy(map, &m16, 2);
  PutBytes16(_mm256_castsi256_si128(
                 _mm256_permutevar8x32_epi32(_mm256_packus_epi16(o.sym, o.sym), v.order)),
             m16, syms, j);
}

// Near-lossless, 16 ordinary elements (groups a and b of 8) whose fields have at most 8 bits
// (width_cap <= 7), for the shift join of 32 elements a step (PutNarrow32). Writes the two
// zero-map bytes at map and the nonzero symbols at syms + *j. The field y >> (8 - k2) is a
// high multiply by 2^(8 + k2); one multiply-add then joins each pair of fields, field1 *
// 2^width0 + field0 (at most 255 * 256 + 255, so the signed 16-bit multiply is exact).
struct Narrow16 {
  __m256i pairs;      // 32-bit lanes [a01 a23 b01 b23 | a45 a67 b45 b67], <= 16 bits each
  __m256i pair_bits;  // their widths, same lanes
  __m256i special;    // nonzero where an element is not ordinary: then nothing else holds
};
template <typename U, bool kSubnormals>
__attribute__((target("avx2,popcnt"), always_inline)) inline Narrow16 QuantizeNarrow16(
    const U* in, const QuantVectors& v, uint8_t* map, uint8_t* syms, size_t* j) {
  const Ordinary16 o = QuantizeOrdinary16<U, kSubnormals>(in, v);
  PutMapAndSymbols16(o, v, map, syms, j);
  // 2^(8 + k2) for a nonzero element (low byte from index 0, high byte from 8 + k2); 0 for a
  // zero (index bytes with the top bit set), which zeroes its field.
  const __m256i mult =
      _mm256_shuffle_epi8(v.pow_by_k, _mm256_or_si256(_mm256_slli_epi16(o.k2_8, 8), o.zero));
  const __m256i value16 = _mm256_mulhi_epu16(o.y, mult);
  const __m256i bits16 = _mm256_andnot_si256(o.zero, _mm256_sub_epi16(o.k2_8, v.seven16));
  // 2^width: mult / 2^7 for a nonzero element, 1 for a zero; moved into the odd lane beside.
  const __m256i pow16 = _mm256_max_epu16(_mm256_srli_epi16(mult, 7), v.one16);
  const __m256i mult_pairs = _mm256_or_si256(_mm256_slli_epi32(pow16, 16), v.one);
  return {_mm256_madd_epi16(value16, mult_pairs), _mm256_madd_epi16(bits16, v.one16), o.special};
}

// PutOrdinaryBytes8 for 16 elements in 16-bit lanes, with their zero-map bytes and symbols:
// B = y >> 1 and the mask of its top k2 + 1 bits share a lane, a shuffle and a permute
// gather each group's 8 bytes and 8 masks, and one PEXT per group joins its fields. Writes
// nothing and returns false where an element is not ordinary.
template <typename U, bool kSubnormals>
__attribute__((target("avx2,bmi2,popcnt"), always_inline)) inline bool PutOrdinaryBytes16(
    const U* in, const QuantVectors& v, uint8_t* map, uint8_t* syms, size_t* j, WordWriter& w) {
  const Ordinary16 o = QuantizeOrdinary16<U, kSubnormals>(in, v);
  if (__builtin_expect(!_mm256_testz_si256(o.special, o.special), 0)) return false;
  PutMapAndSymbols16(o, v, map, syms, j);
  const __m256i lanes = _mm256_or_si256(
      _mm256_srli_epi16(o.y, 1),
      _mm256_shuffle_epi8(v.keep_by_k, _mm256_or_si256(_mm256_slli_epi16(o.k2_8, 8), o.zero)));
  // 32-bit units [B a0-3, B b0-3, masks a0-3, masks b0-3 | the same for 4-7], then in order.
  const __m256i split = _mm256_permutevar8x32_epi32(
      _mm256_shuffle_epi8(
          lanes, _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6,
                                  8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15)),
      v.order);
  PutPext16(_mm256_castsi256_si128(split), _mm256_extracti128_si256(split, 1), w);
  return true;
}

// The 32 fields of two Narrow16 (groups a, b and c, d) appended to the plane: the pairs
// joined in fours (32-bit lanes [a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7]), put in element
// order, joined in eights (<= 64 bits each) and written with four Puts.
__attribute__((target("avx2,bmi2"), always_inline)) inline void PutNarrow32(const Narrow16& ab,
                                                                            const Narrow16& cd,
                                                                            const QuantVectors& v,
                                                                            WordWriter& w) {
  const __m256i pairs = _mm256_packus_epi32(ab.pairs, cd.pairs);  // <= 65535: no saturation
  const __m256i pair_bits = _mm256_packus_epi32(ab.pair_bits, cd.pair_bits);
  const __m256i fours = _mm256_or_si256(
      _mm256_and_si256(pairs, v.lo16),
      _mm256_sllv_epi32(_mm256_srli_epi32(pairs, 16), _mm256_and_si256(pair_bits, v.lo16)));
  const __m256i four_bits = _mm256_madd_epi16(pair_bits, v.one16);
  const Pairs4 eights = JoinPairs(_mm256_permutevar8x32_epi32(fours, v.order),
                                  _mm256_permutevar8x32_epi32(four_bits, v.order));
  const __m128i v_lo = _mm256_castsi256_si128(eights.value);
  const __m128i v_hi = _mm256_extracti128_si256(eights.value, 1);
  const __m128i b_lo = _mm256_castsi256_si128(eights.bits);
  const __m128i b_hi = _mm256_extracti128_si256(eights.bits, 1);
  w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(v_lo)),
        static_cast<unsigned>(_mm_cvtsi128_si32(b_lo)));
  w.Put(static_cast<uint64_t>(_mm_extract_epi64(v_lo, 1)),
        static_cast<unsigned>(_mm_extract_epi32(b_lo, 2)));
  w.Put(static_cast<uint64_t>(_mm_cvtsi128_si64(v_hi)),
        static_cast<unsigned>(_mm_cvtsi128_si32(b_hi)));
  w.Put(static_cast<uint64_t>(_mm_extract_epi64(v_hi, 1)),
        static_cast<unsigned>(_mm_extract_epi32(b_hi, 2)));
}

// How the near-lossless ordinary groups' fields are joined: shifts for any width, shifts
// for widths of <= 8 bits (width_cap <= 7), or PEXT (width_cap <= 7 and FastPext()).
enum class Join { kShifts, kNarrowShifts, kPext };

// P == kGeneral is near-lossless where the block's floor keeps exponent field 0: groups
// holding no subnormal take the ordinary forms with zero_below 1 (their field-0 elements
// are zeros either way), the others the general form with the block's own parameters.
template <typename U, SplitPath P, Join J = Join::kShifts>
__attribute__((target("avx2,bmi2,popcnt"))) size_t SplitAvx2Typed(const U* in, size_t n,
                                                                  const QuantParams& q,
                                                                  uint8_t* plane, uint8_t* syms,
                                                                  uint64_t* bitmap, size_t* nnz) {
  // Lossless fields of f32 (24 bits) and bf16 (8 bits) are whole bytes.
  constexpr bool kByteFields = P == SplitPath::kLossless && sizeof(U) == 4;
  const bool byte_fields16 = P == SplitPath::kLossless && q.mant_bits == 7;
  constexpr bool kSubnormals = P == SplitPath::kGeneral;
  const QuantVectors v = MakeQuantVectors(q, kSubnormals ? 1 : q.zero_below);
  uint8_t* bytes = plane;  // where byte-aligned fields go next
  WordWriter w(plane);
  size_t j = 0;
  // The bitmap is written a byte (8 elements) at a time: x86 is little-endian, so byte b of
  // the words holds elements 8b .. 8b + 7. The last word's bytes past the end stay zero.
  uint8_t* mask_bytes = reinterpret_cast<uint8_t*>(bitmap);
  if (n > 0) bitmap[(n - 1) / kGroup] = 0;
  size_t i = 0;
  // The group's zero-map byte and its nonzero symbols; returns the nonzero mask.
  const auto put_map_and_symbols = [&](size_t at, __m256i nz, __m256i sym)
      __attribute__((target("avx2,popcnt"), always_inline)) {
    const uint32_t m8 = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(nz)));
    mask_bytes[at / 8] = static_cast<uint8_t>(m8);
    PutBytes8(sym, m8, syms + j);
    j += static_cast<size_t>(__builtin_popcount(m8));
    return m8;
  };
  // Elements at .. at + 7.
  const auto step8 = [&](size_t at) __attribute__((target("avx2,bmi2,popcnt"), always_inline)) {
    const __m256i u = Load8(in + at);
    Quantized8 r;
    if constexpr (P == SplitPath::kLossless) {
      r = QuantizeLossless8(u, v);
    } else {
      const __m256i e = Exponents8(u, v);
      if (__builtin_expect(_mm256_movemask_epi8(NotOrdinary8<kSubnormals>(u, e, v)) == 0, 1)) {
        if constexpr (J == Join::kPext) {
          __m256i sym;
          const __m256i nz = PutOrdinaryBytes8<U>(u, e, v, w, &sym);
          put_map_and_symbols(at, nz, sym);
          return;
        }
        r = QuantizeOrdinary8<U>(u, e, v);
        if constexpr (J == Join::kNarrowShifts) {  // no width test needed
          put_map_and_symbols(at, r.nz, r.sym);
          PutEights(JoinPairs(r.value, r.bits), w);
          return;
        }
      } else {
        r = QuantizeGeneral8(u, v);
      }
    }
    // Symbols first: sym is then dead before the fields' join, which needs the registers.
    const uint32_t m8 = put_map_and_symbols(at, r.nz, r.sym);
    if constexpr (kByteFields) {
      bytes = PutTriples8(r.value, m8, bytes);
    } else if (byte_fields16) {
      PutBytes8(r.value, m8, bytes);
      bytes += __builtin_popcount(m8);
    } else {
      PutFields8<U>(r.value, r.bits, w);
    }
  };
  if constexpr (J == Join::kNarrowShifts) {
    // 32 elements a step where all of them are ordinary, else 8 at a time.
    for (; i + 32 <= n; i += 32) {
      const size_t j0 = j;
      const Narrow16 ab = QuantizeNarrow16<U, kSubnormals>(in + i, v, mask_bytes + i / 8, syms, &j);
      const Narrow16 cd =
          QuantizeNarrow16<U, kSubnormals>(in + i + 16, v, mask_bytes + i / 8 + 2, syms, &j);
      const __m256i special = _mm256_or_si256(ab.special, cd.special);
      if (__builtin_expect(!_mm256_testz_si256(special, special), 0)) {
        j = j0;  // the zero-map bytes and symbols are written again
        for (int g = 0; g < 4; ++g) step8(i + 8 * g);
        continue;
      }
      PutNarrow32(ab, cd, v, w);
    }
  }
  // 16 elements a step with PEXT, unless subnormals may be nonzero: then a step of 16 would
  // often hold one and be done again 8 at a time (f16 gradients).
  if constexpr (J == Join::kPext && !kSubnormals) {
    for (; i + 16 <= n; i += 16) {
      if (__builtin_expect(
              !PutOrdinaryBytes16<U, kSubnormals>(in + i, v, mask_bytes + i / 8, syms, &j, w), 0)) {
        step8(i);
        step8(i + 8);
      }
    }
  }
  for (; i + 8 <= n; i += 8) step8(i);
  if (i < n) {  // the last few elements of the block
    Group g;
    mask_bytes[i / 8] = static_cast<uint8_t>(QuantizeScalarTyped(in + i, n - i, q, &g));
    PackTail(g, n - i, kByteFields || byte_fields16, &bytes, syms, &w, &j);
  }
  *nnz = j;
  if (kByteFields || byte_fields16) return static_cast<size_t>(bytes - plane);
  return w.Finish();
}

template <typename U, SplitPath P>
size_t SplitAvx2Near(const U* in, size_t n, const QuantParams& q, uint8_t* plane, uint8_t* syms,
                     uint64_t* bitmap, size_t* nnz, bool pext) {
  if (q.width_cap <= 7) {
    return pext ? SplitAvx2Typed<U, P, Join::kPext>(in, n, q, plane, syms, bitmap, nnz)
                : SplitAvx2Typed<U, P, Join::kNarrowShifts>(in, n, q, plane, syms, bitmap, nnz);
  }
  return SplitAvx2Typed<U, P>(in, n, q, plane, syms, bitmap, nnz);
}

template <typename U>
size_t SplitAvx2(const U* in, size_t n, const QuantParams& q, uint8_t* plane, uint8_t* syms,
                 uint64_t* bitmap, size_t* nnz, bool pext) {
  const SplitPath path = SplitPathOf(q);
  if (path == SplitPath::kLossless) {
    return SplitAvx2Typed<U, SplitPath::kLossless>(in, n, q, plane, syms, bitmap, nnz);
  }
  if (path == SplitPath::kNearLossless) {
    return SplitAvx2Near<U, SplitPath::kNearLossless>(in, n, q, plane, syms, bitmap, nnz, pext);
  }
  return SplitAvx2Near<U, SplitPath::kGeneral>(in, n, q, plane, syms, bitmap, nnz, pext);
}

}  // namespace

size_t SplitElementsAvx2(DType dtype, const void* in, size_t n, const QuantParams& q,
                         uint8_t* plane, uint8_t* syms, uint64_t* bitmap, size_t* nnz, bool pext) {
  if (dtype == DType::kF32) {
    return SplitAvx2(static_cast<const uint32_t*>(in), n, q, plane, syms, bitmap, nnz, pext);
  }
  return SplitAvx2(static_cast<const uint16_t*>(in), n, q, plane, syms, bitmap, nnz, pext);
}

int MaxFiniteExponentAvx2(DType dtype, const void* in, size_t n) {
  const FloatBits lay = FloatBitsOf(dtype);
  const uint32_t mag_mask = (uint32_t{1} << (lay.total_bits - 1)) - 1;
  const uint32_t inf = static_cast<uint32_t>(lay.all_ones()) << lay.mant_bits;
  const uint32_t mag = dtype == DType::kF32
                           ? MaxFiniteMagAvx2(static_cast<const uint32_t*>(in), n, mag_mask, inf)
                           : MaxFiniteMagAvx2(static_cast<const uint16_t*>(in), n, mag_mask, inf);
  return static_cast<int>(mag >> lay.mant_bits);
}

}  // namespace gcomp::codec::internal

#endif  // __x86_64__
