// DType, Mode and Policy helpers and the exact f32 widening / RNE narrowing.
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "codec/codec.h"

namespace gcomp::codec {
namespace {

inline uint32_t F32Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsF32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t HalfToF32Bits(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 31, m = h & 0x3ff;
  if (e == 0) {
    if (m == 0) return sign;
    // Subnormal: m * 2^-24 is exact in float.
    return sign | F32Bits(static_cast<float>(m) * 5.9604644775390625e-8f);
  }
  if (e == 31) return sign | 0x7f800000u | (m << 13);
  return sign | ((e + 112) << 23) | (m << 13);
}

inline uint16_t F32BitsToHalf(uint32_t x) {
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // Inf or NaN (a NaN stays a NaN: quiet bit set, payload top bits)
    return sign | 0x7c00 | (x > 0x7f800000u ? (0x200 | ((x >> 13) & 0x3ff)) : 0);
  }
  if (x >= 0x477ff000u) return sign | 0x7c00;  // rounds to Inf (>= 65520)
  if (x < 0x38800000u) {                       // below 2^-14: subnormal or zero
    if (x <= 0x33000000u) return sign;         // <= 2^-25 rounds (ties to even) to 0
    const uint32_t e = x >> 23, m = (x & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t h = (((x >> 23) - 112) << 10) | ((x >> 13) & 0x3ff);
  const uint32_t rem = x & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return sign | static_cast<uint16_t>(h);
}

inline uint16_t F32BitsToBF16(uint32_t x) {
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1)) >> 16);
}

}  // namespace

size_t DTypeBytes(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
  }
  return "invalid";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  if (name == "f32" || name == "float32") return DType::kF32;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  if (name == "f16" || name == "float16") return DType::kF16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (want f32, bf16 or f16)"));
}

absl::StatusOr<Mode> ParseMode(absl::string_view name) {
  if (name == "lossless") return Mode::kLossless;
  if (name == "near-lossless" || name == "near_lossless") return Mode::kNearLossless;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown mode '", name, "' (want lossless or near-lossless)"));
}

absl::string_view ModeName(Mode mode) {
  return mode == Mode::kLossless ? "lossless" : "near-lossless";
}

std::optional<PolicyRangeError> CheckPolicyRanges(const Policy& policy) {
  if (policy.rel_bits < 0 || policy.rel_bits > 23) {
    return PolicyRangeError{"rel_bits", absl::StrCat("must be in [0, 23], got ", policy.rel_bits)};
  }
  if (policy.abs_log2 < -128 || policy.abs_log2 > 0) {
    return PolicyRangeError{"abs_log2",
                            absl::StrCat("must be in [-128, 0], got ", policy.abs_log2)};
  }
  return std::nullopt;
}

absl::Status ValidatePolicy(const Policy& policy) {
  if (policy.mode != Mode::kLossless && policy.mode != Mode::kNearLossless) {
    return absl::InvalidArgumentError("bad mode");
  }
  if (std::optional<PolicyRangeError> e = CheckPolicyRanges(policy)) {
    return absl::InvalidArgumentError(absl::StrCat(e->field, " ", e->rule));
  }
  return absl::OkStatus();
}

double ErrorBound(const Policy& policy, double x, double block_max_abs) {
  if (policy.mode == Mode::kLossless || !std::isfinite(x)) return 0.0;
  return std::max(std::ldexp(std::fabs(x), -(policy.rel_bits + 1)),
                  std::ldexp(block_max_abs, policy.abs_log2));
}

void ToF32(DType dtype, const void* in, size_t n, float* out) {
  const uint8_t* p = static_cast<const uint8_t*>(in);
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memmove(out, in, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = BitsF32(uint32_t{h} << 16);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = BitsF32(HalfToF32Bits(h));
      }
      return;
  }
}

void FromF32(DType dtype, const float* in, size_t n, void* out) {
  uint8_t* p = static_cast<uint8_t*>(out);
  switch (dtype) {
    case DType::kF32:
      if (n > 0) std::memmove(out, in, n * 4);
      return;
    case DType::kBF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = F32BitsToBF16(F32Bits(in[i]));
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
    case DType::kF16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t h = F32BitsToHalf(F32Bits(in[i]));
        std::memcpy(p + 2 * i, &h, 2);
      }
      return;
  }
}

}  // namespace gcomp::codec
