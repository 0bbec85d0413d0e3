#include "codec/internal/quantize.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace gcomp::codec::internal {

QuantParams MakeQuantParams(const Layout& lay, const Policy& policy, int emax) {
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

template <typename U>
void AssembleScalarTyped(const uint8_t* sym, const uint32_t* field, size_t count,
                         const QuantParams& q, U* out) {
  const int W = q.mant_bits;
  for (size_t i = 0; i < count; ++i) {
    const uint32_t s = sym[i];
    const int k = WidthOf(q, static_cast<int>(s));
    const uint32_t f = field[i];
    const uint32_t mant = f & ((1u << k) - 1);
    const uint32_t sign = (f >> k) & 1;
    const U v = static_cast<U>((sign << q.top) | (s << W) | (mant << (W - k)));
    std::memcpy(out + i, &v, sizeof(U));
  }
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
__attribute__((target("avx2"))) uint32_t MaxFiniteMagAvx2(const U* in, size_t n,
                                                          uint32_t mag_mask, uint32_t inf) {
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

template <typename U>
__attribute__((target("avx2"))) uint64_t QuantizeAvx2Typed(const U* in, size_t count,
                                                            const QuantParams& q, Group* g) {
  const __m256i mag_mask = _mm256_set1_epi32(static_cast<int>(q.mag_mask));
  const __m256i mant_mask = _mm256_set1_epi32(static_cast<int>(q.mant_mask));
  const __m256i zero_test = _mm256_set1_epi32(static_cast<int>(q.zero_test));
  const __m256i zero_floor = _mm256_set1_epi32(q.zero_below - 1);
  const __m256i offset = _mm256_set1_epi32(q.width_offset);
  const __m256i cap = _mm256_set1_epi32(q.width_cap);
  const __m256i full = _mm256_set1_epi32(q.mant_bits);
  const __m256i special_above = _mm256_set1_epi32(q.special_above);
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i all = _mm256_set1_epi32(-1);
  const __m128i W = _mm_cvtsi32_si128(q.mant_bits);
  const __m128i top = _mm_cvtsi32_si128(q.top);
  uint64_t mask = 0;
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i u = Load8(in + i);
    const __m256i mag = _mm256_and_si256(u, mag_mask);
    const __m256i e = _mm256_srl_epi32(mag, W);
    const __m256i is_zero = _mm256_cmpeq_epi32(_mm256_and_si256(u, zero_test),
                                               _mm256_setzero_si256());
    // nz = e >= zero_below && (u & zero_test) != 0
    const __m256i nz = _mm256_andnot_si256(is_zero, _mm256_cmpgt_epi32(e, zero_floor));
    const __m256i drop = _mm256_sub_epi32(full, WidthOf8(e, offset, cap, full, special_above));
    const __m256i half = _mm256_srli_epi32(_mm256_sllv_epi32(one, drop), 1);
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(mag, half), _mm256_sllv_epi32(all, drop));
    const __m256i e2 = _mm256_srl_epi32(r, W);
    const __m256i k2 = WidthOf8(e2, offset, cap, full, special_above);
    const __m256i mant =
        _mm256_srlv_epi32(_mm256_and_si256(r, mant_mask), _mm256_sub_epi32(full, k2));
    const __m256i sign = _mm256_sllv_epi32(_mm256_srl_epi32(u, top), k2);
    const __m256i value = _mm256_and_si256(_mm256_or_si256(mant, sign), nz);
    const __m256i bits = _mm256_and_si256(_mm256_add_epi32(k2, one), nz);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->value + i), value);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->bits + i), bits);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(g->sym + i), e2);
    mask |= static_cast<uint64_t>(static_cast<uint32_t>(
                _mm256_movemask_ps(_mm256_castsi256_ps(nz))))
            << i;
  }
  if (i < count) {
    Group tail;
    const uint64_t m = QuantizeScalarTyped(in + i, count - i, q, &tail);
    for (size_t j = 0; j < count - i; ++j) {
      g->value[i + j] = tail.value[j];
      g->bits[i + j] = tail.bits[j];
      g->sym[i + j] = tail.sym[j];
    }
    mask |= m << i;
  }
  return mask;
}

template <typename U>
__attribute__((target("avx2"))) void AssembleAvx2Typed(const uint8_t* sym, const uint32_t* field,
                                                       size_t count, const QuantParams& q,
                                                       U* out) {
  const __m256i offset = _mm256_set1_epi32(q.width_offset);
  const __m256i cap = _mm256_set1_epi32(q.width_cap);
  const __m256i full = _mm256_set1_epi32(q.mant_bits);
  const __m256i special_above = _mm256_set1_epi32(q.special_above);
  const __m256i one = _mm256_set1_epi32(1);
  const __m128i W = _mm_cvtsi32_si128(q.mant_bits);
  const __m128i top = _mm_cvtsi32_si128(q.top);
  size_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i s = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sym + i)));
    const __m256i f = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(field + i));
    const __m256i k = WidthOf8(s, offset, cap, full, special_above);
    const __m256i mant = _mm256_and_si256(f, _mm256_sub_epi32(_mm256_sllv_epi32(one, k), one));
    const __m256i sign = _mm256_and_si256(_mm256_srlv_epi32(f, k), one);
    const __m256i v = _mm256_or_si256(
        _mm256_or_si256(_mm256_sll_epi32(sign, top), _mm256_sll_epi32(s, W)),
        _mm256_sllv_epi32(mant, _mm256_sub_epi32(full, k)));
    if constexpr (sizeof(U) == 4) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), v);
    } else {
      // 8 x u32 (each < 2^16) -> 8 x u16, in order.
      const __m128i lo = _mm256_castsi256_si128(v);
      const __m128i hi = _mm256_extracti128_si256(v, 1);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi32(lo, hi));
    }
  }
  AssembleScalarTyped(sym + i, field + i, count - i, q, out + i);
}

bool DetectAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

#endif  // __x86_64__

}  // namespace

int MaxFiniteExponentScalar(DType dtype, const void* in, size_t n) {
  const Layout lay = LayoutOf(dtype);
  const uint32_t mag_mask = (uint32_t{1} << (lay.total_bits - 1)) - 1;
  const uint32_t inf = static_cast<uint32_t>(lay.all_ones()) << lay.mant_bits;
  const uint32_t mag =
      dtype == DType::kF32
          ? MaxFiniteMagScalar(static_cast<const uint32_t*>(in), n, mag_mask, inf)
          : MaxFiniteMagScalar(static_cast<const uint16_t*>(in), n, mag_mask, inf);
  return static_cast<int>(mag >> lay.mant_bits);
}

int MaxFiniteExponent(DType dtype, const void* in, size_t n) {
#if defined(__x86_64__)
  if (QuantizeUsesAvx2()) {
    const Layout lay = LayoutOf(dtype);
    const uint32_t mag_mask = (uint32_t{1} << (lay.total_bits - 1)) - 1;
    const uint32_t inf = static_cast<uint32_t>(lay.all_ones()) << lay.mant_bits;
    const uint32_t mag =
        dtype == DType::kF32
            ? MaxFiniteMagAvx2(static_cast<const uint32_t*>(in), n, mag_mask, inf)
            : MaxFiniteMagAvx2(static_cast<const uint16_t*>(in), n, mag_mask, inf);
    return static_cast<int>(mag >> lay.mant_bits);
  }
#endif
  return MaxFiniteExponentScalar(dtype, in, n);
}

bool QuantizeUsesAvx2() {
#if defined(__x86_64__)
  static const bool avx2 = DetectAvx2();
  return avx2;
#else
  return false;
#endif
}

uint64_t QuantizeGroupScalar(DType dtype, const void* in, size_t count, const QuantParams& q,
                             Group* g) {
  if (dtype == DType::kF32) {
    return QuantizeScalarTyped(static_cast<const uint32_t*>(in), count, q, g);
  }
  return QuantizeScalarTyped(static_cast<const uint16_t*>(in), count, q, g);
}

void AssembleElementsScalar(DType dtype, const uint8_t* sym, const uint32_t* field,
                            size_t count, const QuantParams& q, void* out) {
  if (dtype == DType::kF32) {
    AssembleScalarTyped(sym, field, count, q, static_cast<uint32_t*>(out));
  } else {
    AssembleScalarTyped(sym, field, count, q, static_cast<uint16_t*>(out));
  }
}

void AssembleElements(DType dtype, const uint8_t* sym, const uint32_t* field, size_t count,
                      const QuantParams& q, void* out) {
#if defined(__x86_64__)
  if (QuantizeUsesAvx2()) {
    if (dtype == DType::kF32) {
      AssembleAvx2Typed(sym, field, count, q, static_cast<uint32_t*>(out));
    } else {
      AssembleAvx2Typed(sym, field, count, q, static_cast<uint16_t*>(out));
    }
    return;
  }
#endif
  AssembleElementsScalar(dtype, sym, field, count, q, out);
}

uint64_t QuantizeGroup(DType dtype, const void* in, size_t count, const QuantParams& q,
                       Group* g) {
#if defined(__x86_64__)
  if (QuantizeUsesAvx2()) {
    if (dtype == DType::kF32) {
      return QuantizeAvx2Typed(static_cast<const uint32_t*>(in), count, q, g);
    }
    return QuantizeAvx2Typed(static_cast<const uint16_t*>(in), count, q, g);
  }
#endif
  return QuantizeGroupScalar(dtype, in, count, q, g);
}

}  // namespace gcomp::codec::internal
