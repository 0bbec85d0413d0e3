#include "codec/internal/quantize.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/internal/join_elements.h"
#include "codec/testing/values.h"
#include "gtest/gtest.h"

namespace gcomp::codec::internal {
namespace {

using testing::MakeValues;
using testing::Pattern;

std::vector<Policy> Policies() {
  std::vector<Policy> out;
  Policy lossless;
  lossless.mode = Mode::kLossless;
  out.push_back(lossless);
  for (auto [r, a] : {std::pair{7, -16}, {3, -8}, {10, -24}, {0, -4}, {23, -128}, {23, 0}}) {
    Policy p;
    p.rel_bits = r;
    p.abs_log2 = a;
    out.push_back(p);
  }
  return out;
}

TEST(Quantize, ClosedFormWidthEqualsFormatDefinition) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const FloatBits lay = FloatBitsOf(dtype);
    for (const Policy& p : Policies()) {
      for (int emax = 0; emax < lay.all_ones(); ++emax) {
        const QuantParams q = MakeQuantParams(lay, p, emax);
        for (int s = 0; s < lay.alphabet(); ++s) {
          ASSERT_EQ(WidthOf(q, s), MantissaWidth(lay, p.mode, p.rel_bits, p.abs_log2, emax, s))
              << DTypeName(dtype) << " R=" << p.rel_bits << " A=" << p.abs_log2 << " emax=" << emax
              << " s=" << s;
        }
      }
    }
  }
}

// Every vector level, joining short fields with shifts and with PEXT, writes what the
// scalar pass writes for in[0, n).
void ExpectVectorSplitsEqualScalar(DType dtype, const void* in, size_t n, const QuantParams& q,
                                   const std::string& where) {
  const FloatBits lay = FloatBitsOf(dtype);
  const size_t plane_room = (n * (lay.mant_bits + 1) + 7) / 8 + 16;
  const size_t words = (n + 63) / 64;
  std::vector<uint8_t> fast_plane(plane_room), slow_plane(plane_room);
  std::vector<uint8_t> fast_syms(n + 8), slow_syms(n + 8);
  std::vector<uint64_t> fast_bits(words), slow_bits(words);
  size_t slow_nnz = 0;
  const size_t slow_bytes = SplitElementsScalar(dtype, in, n, q, slow_plane.data(),
                                                slow_syms.data(), slow_bits.data(), &slow_nnz);
  for (auto [level, pext] : {std::pair{VectorLevel::kAvx2, false},
                             {VectorLevel::kAvx2, true},
                             {VectorLevel::kAvx512, false},
                             {VectorLevel::kAvx512, true}}) {
    if (level > MaxVectorLevel()) continue;
    size_t fast_nnz = 0;
    std::fill(fast_bits.begin(), fast_bits.end(), ~uint64_t{0});
    std::fill(fast_syms.begin(), fast_syms.end(), 0xee);
    const size_t fast_bytes = SplitElementsAt(level, dtype, in, n, q, fast_plane.data(),
                                              fast_syms.data(), fast_bits.data(), &fast_nnz, pext);
    const std::string how = absl::StrCat(level == VectorLevel::kAvx2 ? "AVX2 " : "AVX-512 ",
                                         pext ? "(PEXT) " : "", where);
    ASSERT_EQ(fast_nnz, slow_nnz) << how;
    ASSERT_EQ(fast_bytes, slow_bytes) << how;
    ASSERT_EQ(fast_bits, slow_bits) << how;
    ASSERT_EQ(0, std::memcmp(fast_plane.data(), slow_plane.data(), slow_bytes)) << how;
    ASSERT_EQ(0, std::memcmp(fast_syms.data(), slow_syms.data(), slow_nnz)) << how;
  }
}

// The vectorized pass (where this CPU has it) must write the same plane, symbols and bitmap
// as the scalar one, for every pattern, dtype, policy and length (tails included).
TEST(Quantize, VectorSplitEqualsScalarSplit) {
  if (MaxVectorLevel() < VectorLevel::kAvx2)
    GTEST_SKIP() << "this CPU has no AVX2: only the scalar path runs";
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const FloatBits lay = FloatBitsOf(dtype);
    for (Pattern pattern : {Pattern::kZeros, Pattern::kConstant, Pattern::kRandomBits,
                            Pattern::kGradientLike, Pattern::kSpecials, Pattern::kBoundaries}) {
      const std::vector<uint8_t> values = MakeValues(dtype, pattern, 4096, 7);
      const size_t total = values.size() / DTypeBytes(dtype);
      EXPECT_EQ(MaxFiniteExponent(dtype, values.data(), total),
                MaxFiniteExponentScalar(dtype, values.data(), total));
      for (const Policy& p : Policies()) {
        for (size_t n :
             {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{15}, size_t{16},
              size_t{17}, size_t{31}, size_t{32}, size_t{33}, size_t{40}, size_t{63}, size_t{64},
              size_t{65}, size_t{1000}, total}) {
          for (size_t lo : {size_t{0}, size_t{3}, total / 2}) {
            if (lo + n > total) continue;
            const uint8_t* in = values.data() + lo * DTypeBytes(dtype);
            const int emax = MaxFiniteExponentScalar(dtype, in, n);
            const QuantParams q = MakeQuantParams(lay, p, emax);
            ExpectVectorSplitsEqualScalar(
                dtype, in, n, q,
                absl::StrCat(DTypeName(dtype), " ", PatternName(pattern), " R=", p.rel_bits,
                             " A=", p.abs_log2, " n=", n, " at ", lo));
            if (HasFatalFailure()) return;
          }
        }
      }
    }
  }
}

// f32 blocks so small that the floor keeps exponent field 0 (zero_below 0): subnormals keep
// all their bits, and a step of 32 holding one must leave the narrow joins for the general
// form. Half of each block has no subnormal, so both kinds of step run.
TEST(Quantize, TinyF32BlocksKeepTheirSubnormals) {
  if (MaxVectorLevel() < VectorLevel::kAvx2)
    GTEST_SKIP() << "this CPU has no AVX2: only the scalar path runs";
  const FloatBits lay = FloatBitsOf(DType::kF32);
  std::mt19937 rng(11);
  const size_t n = 2048;
  std::vector<uint32_t> values(n);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t sign = (rng() & 1) << 31;
    const uint32_t mant = rng() & 0x7fffff;
    const bool subnormal_half = i >= n / 2;
    switch (rng() % 8) {
      case 0:
        values[i] = sign;
        break;  // +-0
      case 1:
        values[i] = subnormal_half ? sign | mant | 1 : sign;
        break;  // subnormal
      default:
        values[i] = sign | (1 + rng() % 12) << 23 | mant;  // fields 1-12
    }
  }
  for (auto [r, a] : {std::pair{7, -16}, {3, -12}, {5, -13}}) {
    Policy p;
    p.rel_bits = r;
    p.abs_log2 = a;
    const int emax = MaxFiniteExponentScalar(DType::kF32, values.data(), n);
    const QuantParams q = MakeQuantParams(lay, p, emax);
    ASSERT_EQ(q.zero_below, 0) << "R=" << r << " A=" << a;  // the general form's case
    for (size_t lo : {size_t{0}, n / 2 - 16, n / 2}) {
      ExpectVectorSplitsEqualScalar(DType::kF32, values.data() + lo, n / 2, q,
                                    absl::StrCat("R=", r, " A=", a, " at ", lo));
      if (HasFatalFailure()) return;
    }
  }
}

// Mantissas of all ones round up into the next binade (k2 = k + 1 where k < R), the case the
// PEXT join reads from the unmasked rounded magnitude: both vector passes, with and without
// PEXT/PDEP, must still write and read what the scalar passes do, at every exponent below
// the block's largest.
TEST(Quantize, RoundingCarryIntoTheExponentMatchesScalar) {
  if (MaxVectorLevel() < VectorLevel::kAvx2)
    GTEST_SKIP() << "this CPU has no AVX2: only the scalar path runs";
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const FloatBits lay = FloatBitsOf(dtype);
    const int top_e = lay.all_ones() - 2;  // its carry stays finite
    const uint32_t all_mant = (uint32_t{1} << lay.mant_bits) - 1;
    const size_t n = 1000;
    std::vector<uint8_t> values(n * DTypeBytes(dtype));
    for (size_t i = 0; i < n; ++i) {
      const int e = std::max(1, top_e - static_cast<int>(i % 40));
      // Mostly all-ones mantissas; every third has only its top bits set, so no carry.
      const uint32_t mant = i % 3 == 2 ? all_mant & ~(all_mant >> 4) : all_mant;
      const uint32_t bits =
          uint32_t((i / 40) & 1) << (lay.total_bits - 1) | uint32_t(e) << lay.mant_bits | mant;
      if (lay.total_bits == 32) {
        std::memcpy(values.data() + 4 * i, &bits, 4);
      } else {
        const uint16_t half = static_cast<uint16_t>(bits);
        std::memcpy(values.data() + 2 * i, &half, 2);
      }
    }
    const int emax = MaxFiniteExponentScalar(dtype, values.data(), n);
    ASSERT_EQ(emax, top_e);
    for (const Policy& p : Policies()) {
      const QuantParams q = MakeQuantParams(lay, p, emax);
      const size_t room = (n * (lay.mant_bits + 1) + 7) / 8 + 16;
      std::vector<uint8_t> slow_plane(room), slow_syms(n + 8);
      std::vector<uint64_t> slow_bits((n + 63) / 64);
      size_t slow_nnz = 0;
      const size_t slow_bytes = SplitElementsScalar(dtype, values.data(), n, q, slow_plane.data(),
                                                    slow_syms.data(), slow_bits.data(), &slow_nnz);
      std::vector<uint8_t> slow_out(n * DTypeBytes(dtype));
      const absl::Span<const uint8_t> plane(slow_plane.data(), slow_bytes);
      const uint64_t* bm = slow_nnz == n ? nullptr : slow_bits.data();
      ASSERT_TRUE(
          JoinElementsScalar(dtype, slow_syms.data(), slow_nnz, plane, q, bm, n, slow_out.data())
              .ok());
      for (VectorLevel level : {VectorLevel::kAvx2, VectorLevel::kAvx512}) {
        if (level > MaxVectorLevel()) continue;
        for (bool pext : {false, true}) {
          const std::string where = absl::StrCat(level == VectorLevel::kAvx2 ? "AVX2 " : "AVX-512 ",
                                                 pext ? "(PEXT/PDEP) " : "", DTypeName(dtype),
                                                 " R=", p.rel_bits, " A=", p.abs_log2);
          std::vector<uint8_t> fast_plane(room), fast_syms(n + 8);
          std::vector<uint64_t> fast_bits((n + 63) / 64, ~uint64_t{0});
          size_t fast_nnz = 0;
          const size_t fast_bytes =
              SplitElementsAt(level, dtype, values.data(), n, q, fast_plane.data(),
                              fast_syms.data(), fast_bits.data(), &fast_nnz, pext);
          ASSERT_EQ(fast_nnz, slow_nnz) << where;
          ASSERT_EQ(fast_bytes, slow_bytes) << where;
          ASSERT_EQ(fast_bits, slow_bits) << where;
          ASSERT_EQ(0, std::memcmp(fast_plane.data(), slow_plane.data(), slow_bytes)) << where;
          ASSERT_EQ(0, std::memcmp(fast_syms.data(), slow_syms.data(), slow_nnz)) << where;
          std::vector<uint8_t> fast_out(n * DTypeBytes(dtype), 0xee);
          ASSERT_TRUE(JoinElementsAt(level, dtype, slow_syms.data(), slow_nnz, plane, q, bm, n,
                                     fast_out.data(), pext)
                          .ok())
              << where;
          ASSERT_EQ(fast_out, slow_out) << where;
        }
      }
    }
  }
}

// The decoder's vector pass rebuilds exactly what the scalar one does, from what the encoder
// wrote, with and without a zero bitmap; both reject a plane that is cut short or too long.
TEST(Quantize, VectorJoinEqualsScalarJoin) {
  if (MaxVectorLevel() < VectorLevel::kAvx2)
    GTEST_SKIP() << "this CPU has no AVX2: only the scalar path runs";
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const FloatBits lay = FloatBitsOf(dtype);
    const size_t width = DTypeBytes(dtype);
    for (Pattern pattern : {Pattern::kZeros, Pattern::kConstant, Pattern::kRandomBits,
                            Pattern::kGradientLike, Pattern::kSpecials, Pattern::kBoundaries}) {
      const std::vector<uint8_t> values = MakeValues(dtype, pattern, 5000, 3);
      const size_t total = values.size() / width;
      for (const Policy& p : Policies()) {
        for (size_t n :
             {size_t{1}, size_t{9}, size_t{64}, size_t{100}, size_t{2048}, size_t{2049}, total}) {
          if (n > total) continue;
          const int emax = MaxFiniteExponentScalar(dtype, values.data(), n);
          const QuantParams q = MakeQuantParams(lay, p, emax);
          std::vector<uint8_t> plane((n * (lay.mant_bits + 1) + 7) / 8 + 16);
          std::vector<uint8_t> syms(n + 8, 0);
          std::vector<uint64_t> bitmap((n + 63) / 64);
          size_t nnz = 0;
          const size_t bytes = SplitElementsScalar(dtype, values.data(), n, q, plane.data(),
                                                   syms.data(), bitmap.data(), &nnz);
          const uint64_t* bm = nnz == n ? nullptr : bitmap.data();
          const std::string where = absl::StrCat(DTypeName(dtype), " ", PatternName(pattern),
                                                 " R=", p.rel_bits, " A=", p.abs_log2, " n=", n);
          // Unaligned output, to match callers that hand in any address.
          std::vector<uint8_t> fast(n * width + 1), slow(n * width + 1);
          const absl::Span<const uint8_t> exact(plane.data(), bytes);
          ASSERT_TRUE(
              JoinElementsScalar(dtype, syms.data(), nnz, exact, q, bm, n, slow.data() + 1).ok())
              << where;
          const absl::Span<const uint8_t> cut(plane.data(), bytes - 1);
          const absl::Span<const uint8_t> longer(plane.data(), bytes + 1);
          if (bytes > 0) {
            std::vector<uint8_t> scratch(n * width);
            EXPECT_FALSE(
                JoinElementsScalar(dtype, syms.data(), nnz, cut, q, bm, n, scratch.data()).ok())
                << where;
          }
          // The vector pass reads short fields with shifts or with PDEP.
          for (bool pdep : {false, true}) {
            const std::string how = absl::StrCat(where, pdep ? " (PDEP)" : "");
            std::fill(fast.begin(), fast.end(), 0xee);
            ASSERT_TRUE(JoinElementsAt(MaxVectorLevel(), dtype, syms.data(), nnz, exact, q, bm, n,
                                       fast.data() + 1, pdep)
                            .ok())
                << how;
            ASSERT_EQ(0, std::memcmp(fast.data() + 1, slow.data() + 1, n * width)) << how;
            if (p.mode == Mode::kLossless) {
              ASSERT_EQ(0, std::memcmp(fast.data() + 1, values.data(), n * width)) << how;
            }
            if (bytes == 0) continue;
            EXPECT_FALSE(JoinElementsAt(MaxVectorLevel(), dtype, syms.data(), nnz, cut, q, bm, n,
                                        fast.data(), pdep)
                             .ok())
                << how;
            EXPECT_FALSE(JoinElementsAt(MaxVectorLevel(), dtype, syms.data(), nnz, longer, q, bm, n,
                                        fast.data(), pdep)
                             .ok())
                << how;
          }
        }
      }
    }
  }
}

TEST(Quantize, MaxFiniteExponentSkipsNonFinite) {
  std::vector<float> v = {1.0f,
                          -4.0f,
                          std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          0.5f,
                          3.0f,
                          2.0f,
                          -std::numeric_limits<float>::infinity(),
                          1e-40f};
  // -4.0 has exponent field 129.
  EXPECT_EQ(MaxFiniteExponent(DType::kF32, v.data(), v.size()), 129);
  EXPECT_EQ(MaxFiniteExponentScalar(DType::kF32, v.data(), v.size()), 129);
  std::vector<float> only_inf(17, std::numeric_limits<float>::infinity());
  EXPECT_EQ(MaxFiniteExponent(DType::kF32, only_inf.data(), only_inf.size()), 0);
  // One Inf or NaN anywhere in a longer block (the vector pass takes a second, masked pass
  // only when its plain maximum is not finite), largest finite value before or after it.
  for (float special : {std::numeric_limits<float>::infinity(),
                        -std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t n : {size_t{40}, size_t{100}}) {
      for (size_t at = 0; at < n; ++at) {
        std::vector<float> w(n);
        for (size_t i = 0; i < n; ++i) w[i] = 0.001f * static_cast<float>(i % 7 + 1);
        w[at] = special;
        w[(at + n / 2) % n] = -6.0f;  // exponent field 129
        EXPECT_EQ(MaxFiniteExponent(DType::kF32, w.data(), n), 129) << "n=" << n << " at " << at;
      }
    }
  }
  // The same in 16-bit floats: bf16 -6.0 is 0xc0c0 (field 129), f16 -6.0 is 0xc600 (17).
  struct Half {
    DType dtype;
    uint16_t inf, nan, small, largest;
    int field;
  };
  for (const Half& h : {Half{DType::kBF16, 0x7f80, 0xffc1, 0x3a83, 0xc0c0, 129},
                        Half{DType::kF16, 0x7c00, 0xfe01, 0x1419, 0xc600, 17}}) {
    for (uint16_t special : {h.inf, h.nan}) {
      for (size_t at = 0; at < 100; ++at) {
        std::vector<uint16_t> w(100, h.small);
        w[at] = special;
        w[(at + 50) % 100] = h.largest;
        EXPECT_EQ(MaxFiniteExponent(h.dtype, w.data(), w.size()), h.field)
            << DTypeName(h.dtype) << " at " << at;
      }
    }
  }
}

}  // namespace
}  // namespace gcomp::codec::internal
