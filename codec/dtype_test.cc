// Exact widening and round-to-nearest-even narrowing.
#include <cmath>
#include <cstring>
#include <random>

#include "codec/codec.h"
#include "gtest/gtest.h"

namespace gcomp::codec {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(DType, NarrowWidenIsIdentityForEveryHalfAndBFloat) {
  for (DType dtype : {DType::kBF16, DType::kF16}) {
    for (uint32_t h = 0; h < 65536; ++h) {
      const uint16_t in = static_cast<uint16_t>(h);
      float f;
      ToF32(dtype, &in, 1, &f);
      uint16_t back;
      FromF32(dtype, &f, 1, &back);
      if (std::isnan(f)) {
        float g;
        ToF32(dtype, &back, 1, &g);
        EXPECT_TRUE(std::isnan(g)) << h;
      } else {
        EXPECT_EQ(back, in) << DTypeName(dtype) << " " << h;
      }
    }
  }
}

TEST(DType, F16NarrowingMatchesTheCompiler) {
#ifndef __FLT16_MAX__
  // clang before 15 has no _Float16 on x86; g++ 12 has, so the default build runs this.
  GTEST_SKIP() << "this compiler has no _Float16 on this target";
#else
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = rng();
    if (i % 2) u = (u & 0x807fffffu) | ((100 + u % 45) << 23);  // near the f16 range
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    uint16_t ours;
    FromF32(DType::kF16, &f, 1, &ours);
    _Float16 ref = static_cast<_Float16>(f);
    uint16_t ref_bits;
    std::memcpy(&ref_bits, &ref, 2);
    ASSERT_EQ(ours, ref_bits) << std::hex << u;
  }
#endif
}

TEST(DType, BF16NarrowingRoundsToNearestEven) {
  const float cases[][2] = {{1.0f, 1.0f},
                            {1.00390625f, 1.0f},           // half-way, even below
                            {1.01171875f, 1.015625f},      // half-way, even above
                            {1.0039064f, 1.0078125f},      // just above half-way
                            {3.4028235e38f, INFINITY}};
  for (const auto& c : cases) {
    uint16_t h;
    FromF32(DType::kBF16, &c[0], 1, &h);
    float back;
    ToF32(DType::kBF16, &h, 1, &back);
    EXPECT_EQ(Bits(back), Bits(c[1])) << c[0];
  }
}

TEST(DType, NamesRoundTrip) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16}) {
    EXPECT_EQ(*ParseDType(DTypeName(d)), d);
  }
  EXPECT_EQ(DTypeBytes(DType::kF32), 4u);
  EXPECT_EQ(DTypeBytes(DType::kF16), 2u);
}

}  // namespace
}  // namespace gcomp::codec
