// Test inputs for the codec tests: seeded patterns of element bit patterns.
#ifndef GCOMP_CODEC_TESTING_VALUES_H_
#define GCOMP_CODEC_TESTING_VALUES_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/codec.h"

namespace gcomp::codec::testing {

enum class Pattern { kZeros, kConstant, kRandomBits, kGradientLike, kSpecials, kBoundaries };

inline const char* PatternName(Pattern p) {
  switch (p) {
    case Pattern::kZeros: return "Zeros";
    case Pattern::kConstant: return "Constant";
    case Pattern::kRandomBits: return "RandomBits";
    case Pattern::kGradientLike: return "GradientLike";
    case Pattern::kSpecials: return "Specials";
    case Pattern::kBoundaries: return "Boundaries";
  }
  return "?";
}

// n elements of `dtype` as raw bytes (n * DTypeBytes(dtype)).
inline std::vector<uint8_t> MakeValues(DType dtype, Pattern pattern, size_t n, uint32_t seed) {
  const size_t eb = DTypeBytes(dtype);
  std::vector<uint8_t> out(n * eb);
  std::mt19937_64 rng(seed);
  const int total = eb * 8;
  const int mant = dtype == DType::kF32 ? 23 : dtype == DType::kBF16 ? 7 : 10;
  const int expb = total - 1 - mant;
  const uint32_t all_ones = (1u << expb) - 1;
  auto put = [&](size_t i, uint32_t bits) { std::memcpy(out.data() + i * eb, &bits, eb); };
  auto from_float = [&](float f) {
    uint32_t bits;
    FromF32(dtype, &f, 1, &bits);
    return bits & (total == 32 ? ~0u : 0xffffu);
  };
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> scale(-30, 2);
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits = 0;
    switch (pattern) {
      case Pattern::kZeros:
        bits = 0;
        break;
      case Pattern::kConstant:
        bits = from_float(0.0123f);
        break;
      case Pattern::kRandomBits:
        bits = static_cast<uint32_t>(rng());
        break;
      case Pattern::kGradientLike: {
        float f = rng() % 3 == 0 ? 0.f : std::ldexp(normal(rng), scale(rng));
        bits = from_float(f);
        break;
      }
      case Pattern::kSpecials: {
        // NaN payloads, +-Inf, -0, subnormals, max finite, and their neighbours.
        const uint32_t sign = static_cast<uint32_t>(rng() & 1) << (total - 1);
        const uint32_t m = static_cast<uint32_t>(rng()) & ((1u << mant) - 1);
        switch (rng() % 8) {
          case 0: bits = sign | (all_ones << mant) | (m | 1); break;           // NaN
          case 1: bits = sign | (all_ones << mant); break;                     // Inf
          case 2: bits = sign; break;                                          // +-0
          case 3: bits = sign | m; break;                                      // subnormal
          case 4: bits = sign | (((all_ones - 1) << mant) | m); break;         // top binade
          case 5: bits = sign | ((all_ones << mant) - 1); break;               // max finite
          case 6: bits = sign | (1u << mant) | m; break;                       // min normal
          default: bits = sign | ((static_cast<uint32_t>(rng() % all_ones)) << mant) | m;
        }
        break;
      }
      case Pattern::kBoundaries: {
        // Powers of two +-1 ulp and mantissas at rounding half-way points for every width.
        const uint32_t sign = static_cast<uint32_t>(rng() & 1) << (total - 1);
        const uint32_t e = 1 + static_cast<uint32_t>(rng() % (all_ones - 1));
        const int k = static_cast<int>(rng() % (mant + 1));
        uint32_t m;
        switch (rng() % 4) {
          case 0: m = 0; break;
          case 1: m = (1u << mant) - 1; break;                                  // next power - 1 ulp
          case 2: m = k < mant ? (1u << (mant - k - 1)) : 1; break;             // half-way
          default:
            m = (((1u << mant) - 1) & ~((1u << (mant - k)) - 1)) |
                (k < mant ? 1u << (mant - k - 1) : 0);
        }
        bits = sign | (e << mant) | m;
        if (rng() % 2) bits = (bits & ((1u << (total - 1)) - 1)) ? bits - 1 : bits;  // -1 ulp
        break;
      }
    }
    put(i, bits);
  }
  return out;
}

}  // namespace gcomp::codec::testing

#endif  // GCOMP_CODEC_TESTING_VALUES_H_
