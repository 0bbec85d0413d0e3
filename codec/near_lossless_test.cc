// The near-lossless guarantees, checked element by element for several (R, A).
#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "base/npy.h"
#include "codec/codec.h"
#include "codec/testing/gradients.h"
#include "codec/testing/values.h"
#include "gtest/gtest.h"

namespace gcomp::codec {
namespace {

using testing::MakeValues;
using testing::Pattern;

// Checks every guarantee of Policy for one frame; returns the number of violations.
size_t CountViolations(DType dtype, const std::vector<uint8_t>& in, size_t n,
                       const BufferOptions& options, std::string* why) {
  std::string frame;
  absl::Status st = EncodeBuffer(dtype, in.data(), n, options, &frame);
  if (!st.ok()) {
    *why = st.ToString();
    return n + 1;
  }
  std::vector<uint8_t> out(in.size());
  st = DecodeBuffer(AsBytes(frame), dtype, out.data(), n, 1);
  if (!st.ok()) {
    *why = st.ToString();
    return n + 1;
  }
  std::vector<float> x(n), y(n);
  ToF32(dtype, in.data(), n, x.data());
  ToF32(dtype, out.data(), n, y.data());
  // The bound refers to each block's own largest magnitude: use the frame's block size.
  absl::StatusOr<FrameInfo> frame_info = InspectFrame(AsBytes(frame));
  if (!frame_info.ok()) {
    *why = frame_info.status().ToString();
    return n + 1;
  }
  const size_t per = std::max<size_t>(1, frame_info->block_elements);
  size_t bad = 0;
  for (size_t lo = 0; lo < n; lo += per) {
    const size_t hi = std::min(n, lo + per);
    double m = 0;
    for (size_t i = lo; i < hi; ++i) {
      if (std::isfinite(x[i])) m = std::max(m, std::fabs(static_cast<double>(x[i])));
    }
    for (size_t i = lo; i < hi; ++i) {
      const double a = x[i], b = y[i];
      bool ok;
      if (!std::isfinite(a)) {
        ok = std::memcmp(in.data() + i * DTypeBytes(dtype), out.data() + i * DTypeBytes(dtype),
                         DTypeBytes(dtype)) == 0;
      } else {
        ok = std::isfinite(b) && std::fabs(b - a) <= ErrorBound(options.policy, a, m) &&
             (a != 0 || b == 0) && (b == 0 || std::signbit(a) == std::signbit(b));
      }
      if (!ok) {
        if (bad == 0) {
          *why = "element " + std::to_string(i) + ": " + std::to_string(a) + " -> " +
                 std::to_string(b) + " (block max " + std::to_string(m) + ")";
        }
        ++bad;
      }
    }
  }
  return bad;
}

using Params = std::tuple<DType, std::pair<int, int>, Pattern>;
class NearLosslessBound : public ::testing::TestWithParam<Params> {};

TEST_P(NearLosslessBound, HoldsForEveryElement) {
  const auto [dtype, ra, pattern] = GetParam();
  const size_t n = 20011;
  const std::vector<uint8_t> in = MakeValues(dtype, pattern, n, 1234);
  BufferOptions options;
  options.policy.rel_bits = ra.first;
  options.policy.abs_log2 = ra.second;
  options.block_bytes = 3000 * DTypeBytes(dtype);
  std::string why;
  EXPECT_EQ(CountViolations(dtype, in, n, options, &why), 0u) << why;
}

std::string ParamName(const ::testing::TestParamInfo<Params>& info) {
  const auto& ra = std::get<1>(info.param);
  return std::string(DTypeName(std::get<0>(info.param))) + "_R" + std::to_string(ra.first) +
         "_A" + std::to_string(-ra.second) + "_" + testing::PatternName(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, NearLosslessBound,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(std::pair<int, int>{7, -16}, std::pair<int, int>{3, -8},
                                         std::pair<int, int>{10, -24}, std::pair<int, int>{0, -4},
                                         std::pair<int, int>{23, -128}, std::pair<int, int>{5, 0}),
                       ::testing::Values(Pattern::kZeros, Pattern::kConstant,
                                         Pattern::kRandomBits, Pattern::kGradientLike,
                                         Pattern::kSpecials, Pattern::kBoundaries)),
    ParamName);

TEST(NearLosslessBound, ZerosArePlusZeroInStoredBlocksToo) {
  // Four bf16 values do not compress: the block is stored raw, and its -0.0 used to stay.
  const uint16_t in[4] = {0x8000, 0x3f8d, 0x4013, 0xc06d};  // -0.0, 1.1, 2.3, -3.7
  std::string block;
  ASSERT_TRUE(EncodeBlock(DType::kBF16, in, 4, Policy{}, &block).ok());
  absl::StatusOr<BlockInfo> info = InspectBlock(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(block.data()), block.size()));
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->table, TableKind::kStored);
  uint16_t out[4];
  ASSERT_TRUE(
      DecodeBlock(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(block.data()), block.size()),
                  DType::kBF16, out, 4)
          .ok());
  EXPECT_EQ(out[0], 0u);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(out[i], in[i]) << i;
  // Lossless keeps every bit, -0.0 included.
  Policy lossless;
  lossless.mode = Mode::kLossless;
  block.clear();  // EncodeBlock appends
  ASSERT_TRUE(EncodeBlock(DType::kBF16, in, 4, lossless, &block).ok());
  info = InspectBlock(
      absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(block.data()), block.size()));
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_EQ(info->table, TableKind::kStored);
  ASSERT_TRUE(
      DecodeBlock(absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(block.data()), block.size()),
                  DType::kBF16, out, 4)
          .ok());
  EXPECT_EQ(out[0], 0x8000u);
}

TEST(NearLosslessBound, LargestFiniteValuesNeverBecomeInf) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const int total = DTypeBytes(dtype) * 8;
    const uint32_t max_finite = dtype == DType::kF32 ? 0x7f7fffffu
                                : dtype == DType::kBF16 ? 0x7f7fu : 0x7bffu;
    std::vector<uint8_t> in(64 * DTypeBytes(dtype));
    for (uint32_t i = 0; i < 64; ++i) {
      uint32_t bits = (max_finite - i * 3) | ((i & 1u) << (total - 1));
      std::memcpy(in.data() + i * DTypeBytes(dtype), &bits, DTypeBytes(dtype));
    }
    BufferOptions options;
    options.policy.rel_bits = 0;
    std::string why;
    EXPECT_EQ(CountViolations(dtype, in, 64, options, &why), 0u) << why;
  }
}

TEST(NearLosslessBound, HoldsOnRealGradients) {
  absl::StatusOr<std::vector<std::string>> files = testing::GradientFiles();
  if (!files.ok()) GTEST_SKIP() << files.status().message();
  for (const std::string& path : *files) {
    absl::StatusOr<NpyArray> array = ReadNpyF32(path);
    ASSERT_TRUE(array.ok()) << array.status();
    const size_t n = array->data.size();
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      std::vector<uint8_t> in(n * DTypeBytes(dtype));
      FromF32(dtype, array->data.data(), n, in.data());
      for (auto [r, a] : {std::pair<int, int>{7, -16}, {3, -8}, {10, -24}, {0, -4}}) {
        BufferOptions options;
        options.policy.rel_bits = r;
        options.policy.abs_log2 = a;
        options.threads = 2;
        std::string why;
        EXPECT_EQ(CountViolations(dtype, in, n, options, &why), 0u)
            << path << " " << DTypeName(dtype) << " R=" << r << " A=" << a << ": " << why;
      }
    }
  }
}

TEST(NearLosslessBound, DefaultPolicyReachesThreeXOnRealF32Gradients) {
  absl::StatusOr<std::vector<std::string>> files = testing::GradientFiles();
  if (!files.ok()) GTEST_SKIP() << files.status().message();
  for (const std::string& path : *files) {
    absl::StatusOr<NpyArray> array = ReadNpyF32(path);
    ASSERT_TRUE(array.ok()) << array.status();
    std::string frame;
    ASSERT_TRUE(
        EncodeBuffer(DType::kF32, array->data.data(), array->data.size(), BufferOptions(), &frame)
            .ok());
    EXPECT_GE(array->data.size() * 4.0 / frame.size(), 3.0) << path;
  }
}

TEST(ErrorBound, Formula) {
  Policy p;
  EXPECT_DOUBLE_EQ(ErrorBound(p, 1.0, 1.0), std::ldexp(1.0, -8));
  EXPECT_DOUBLE_EQ(ErrorBound(p, 1e-9, 1.0), std::ldexp(1.0, -16));
  EXPECT_EQ(ErrorBound(p, INFINITY, 1.0), 0.0);
  p.mode = Mode::kLossless;
  EXPECT_EQ(ErrorBound(p, 1.0, 1.0), 0.0);
}

}  // namespace
}  // namespace gcomp::codec
