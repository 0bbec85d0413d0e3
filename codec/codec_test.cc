// Bit-exact lossless round trips over dtype x size x pattern, blocks and frames.
#include "codec/codec.h"

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "base/npy.h"
#include "codec/testing/gradients.h"
#include "codec/testing/values.h"
#include "gtest/gtest.h"

namespace gcomp::codec {
namespace {

using testing::MakeValues;
using testing::Pattern;

constexpr size_t kBlockElems = 1000;  // small blocks so sizes around a block are cheap

using Params = std::tuple<DType, size_t, Pattern>;

class LosslessRoundTrip : public ::testing::TestWithParam<Params> {};

TEST_P(LosslessRoundTrip, FrameIsBitExact) {
  const auto [dtype, n, pattern] = GetParam();
  const std::vector<uint8_t> in = MakeValues(dtype, pattern, n, 42 + n);
  BufferOptions options;
  options.policy.mode = Mode::kLossless;
  options.block_bytes = kBlockElems * DTypeBytes(dtype);
  std::string frame;
  ASSERT_TRUE(EncodeBuffer(dtype, in.data(), n, options, &frame).ok());
  EXPECT_LE(frame.size(), MaxEncodedBytes(n, dtype, options.block_bytes));
  std::vector<uint8_t> out(in.size() + 1, 0xAB);
  ASSERT_TRUE(DecodeBuffer(AsBytes(frame), dtype, out.data(), n, 2).ok());
  EXPECT_TRUE(std::equal(in.begin(), in.end(), out.begin()));
  EXPECT_EQ(out.back(), 0xAB) << "wrote past the output";
}

TEST_P(LosslessRoundTrip, BlockIsBitExact) {
  const auto [dtype, n, pattern] = GetParam();
  const std::vector<uint8_t> in = MakeValues(dtype, pattern, n, 7 + n);
  Policy policy;
  policy.mode = Mode::kLossless;
  std::string block;
  ASSERT_TRUE(EncodeBlock(dtype, in.data(), n, policy, &block).ok());
  EXPECT_LE(block.size(), MaxBlockEncodedBytes(n, dtype));
  absl::StatusOr<BlockInfo> info = InspectBlock(AsBytes(block));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->elements, n);
  std::vector<uint8_t> out(in.size());
  ASSERT_TRUE(DecodeBlock(AsBytes(block), dtype, out.data(), n).ok());
  EXPECT_TRUE(std::equal(in.begin(), in.end(), out.begin()));
}

std::string ParamName(const ::testing::TestParamInfo<Params>& info) {
  return std::string(DTypeName(std::get<0>(info.param))) + "_n" +
         std::to_string(std::get<1>(info.param)) + "_" +
         testing::PatternName(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, LosslessRoundTrip,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(size_t{0}, size_t{1}, size_t{7}, kBlockElems - 1,
                                         kBlockElems, kBlockElems + 1, 5 * kBlockElems + 3),
                       ::testing::Values(Pattern::kZeros, Pattern::kConstant, Pattern::kRandomBits,
                                         Pattern::kGradientLike, Pattern::kSpecials,
                                         Pattern::kBoundaries)),
    ParamName);

TEST(LosslessRoundTrip, AllZeroBlockIsHeaderOnly) {
  std::vector<float> zeros(5000, 0.f);
  std::string block;
  ASSERT_TRUE(EncodeBlock(DType::kF32, zeros.data(), zeros.size(), Policy(), &block).ok());
  EXPECT_EQ(block.size(), kBlockHeaderBytes);
}

TEST(LosslessRoundTrip, NegativeZeroIsKept) {
  const float in[3] = {-0.f, 0.f, -0.f};
  Policy policy;
  policy.mode = Mode::kLossless;
  std::string block;
  ASSERT_TRUE(EncodeBlock(DType::kF32, in, 3, policy, &block).ok());
  float out[3];
  ASSERT_TRUE(DecodeBlock(AsBytes(block), DType::kF32, out, 3).ok());
  EXPECT_EQ(0, std::memcmp(in, out, sizeof(in)));
}

TEST(LosslessRoundTrip, ZeroMapKindFollowsDensity) {
  for (auto [every, kind] : {std::pair<int, ZeroMapKind>{0, ZeroMapKind::kNone},
                             {2, ZeroMapKind::kBitmap},
                             {100, ZeroMapKind::kZeroPositions},
                             {-100, ZeroMapKind::kNonzeroPositions}}) {
    std::vector<float> in(10000);
    for (size_t i = 0; i < in.size(); ++i) {
      bool zero = every == 0 ? false : every > 0 ? (i % every == 1) : (i % -every != 1);
      in[i] = zero ? 0.f : 1.f + i;
    }
    std::string block;
    ASSERT_TRUE(EncodeBlock(DType::kF32, in.data(), in.size(), Policy(), &block).ok());
    absl::StatusOr<BlockInfo> info = InspectBlock(AsBytes(block));
    ASSERT_TRUE(info.ok());
    EXPECT_EQ(info->zero_map, kind) << "every " << every;
    std::vector<float> out(in.size());
    ASSERT_TRUE(DecodeBlock(AsBytes(block), DType::kF32, out.data(), out.size()).ok());
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i] == 0, out[i] == 0) << i;
  }
}

TEST(LosslessRoundTrip, RealGradientsAreBitExact) {
  absl::StatusOr<std::vector<std::string>> files = testing::GradientFiles();
  if (!files.ok()) GTEST_SKIP() << files.status().message();
  for (const std::string& path : *files) {
    absl::StatusOr<NpyArray> array = ReadNpyF32(path);
    ASSERT_TRUE(array.ok()) << array.status();
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const size_t n = array->data.size();
      std::vector<uint8_t> in(n * DTypeBytes(dtype));
      FromF32(dtype, array->data.data(), n, in.data());
      BufferOptions options;
      options.policy.mode = Mode::kLossless;
      options.threads = 2;
      std::string frame;
      ASSERT_TRUE(EncodeBuffer(dtype, in.data(), n, options, &frame).ok());
      std::vector<uint8_t> out(in.size());
      ASSERT_TRUE(DecodeBuffer(AsBytes(frame), dtype, out.data(), n, 2).ok());
      EXPECT_EQ(0, std::memcmp(in.data(), out.data(), in.size()))
          << path << " " << DTypeName(dtype);
      EXPECT_LT(frame.size(), in.size()) << path;
    }
  }
}

// Lossless blocks whose elements leave low mantissa bits unused.

std::string EncodeLossless(DType dtype, const void* in, size_t n, bool trim = true) {
  BlockEncodeOptions options;
  options.policy.mode = Mode::kLossless;
  options.trim_unused_mantissa_bits = trim;
  std::string block;
  EXPECT_TRUE(EncodeBlock(dtype, in, n, options, &block).ok());
  return block;
}

template <typename U>
void ExpectBitExact(DType dtype, const std::vector<U>& in, const std::string& block) {
  std::vector<U> out(in.size(), U{0x5a});
  ASSERT_TRUE(DecodeBlock(AsBytes(block), dtype, out.data(), in.size()).ok());
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(in[i], out[i]) << "element " << i << " of " << in.size();
  }
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Float32 gradients holding bfloat16 values (a bf16 autocast's): 8 bits a nonzero element
// for sign and mantissa instead of 24, and every bit back.
TEST(TrimmedLossless, BfloatValuesInFloat32AreExactInAThirdOfTheBytes) {
  std::vector<uint8_t> raw = MakeValues(DType::kF32, Pattern::kGradientLike, 20000, 5);
  std::vector<uint32_t> in(20000);
  std::memcpy(in.data(), raw.data(), raw.size());
  for (uint32_t& u : in) u &= 0xffff0000u;
  in[3] = 0x7fc10000u;  // a NaN with a payload in the kept bits
  in[4] = 0xff800000u;  // -Inf
  in[5] = 0;
  const std::string trimmed = EncodeLossless(DType::kF32, in.data(), in.size());
  const std::string full = EncodeLossless(DType::kF32, in.data(), in.size(), /*trim=*/false);
  absl::StatusOr<BlockInfo> info = InspectBlock(AsBytes(trimmed));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->policy.mode, Mode::kNearLossless);
  EXPECT_EQ(info->policy.rel_bits, 7);
  // The largest A that zeroes nothing in use: -1 - R - (emax - the least exponent field).
  EXPECT_LE(info->policy.abs_log2, -8);
  EXPECT_EQ(InspectBlock(AsBytes(full))->policy.mode, Mode::kLossless);
  EXPECT_LT(trimmed.size() * 2, full.size()) << trimmed.size() << " vs " << full.size();
  ExpectBitExact(DType::kF32, in, trimmed);
  ExpectBitExact(DType::kF32, in, full);
}

// What near-lossless cannot give back exactly keeps the block in lossless mode.
TEST(TrimmedLossless, BlocksItCannotKeepExactStayLossless) {
  struct Case {
    const char* what;
    std::vector<uint32_t> values;
  };
  const Case cases[] = {
      {"-0.0", {Bits(1.5f), 0x80000000u, Bits(-2.0f)}},
      {"a last mantissa bit", {Bits(1.5f), Bits(1.0f) | 1u}},
      {"a range wider than 2^(127 - R)", {Bits(1e30f), Bits(1e-30f)}},
      // R = 7: exponent fields 127 and 6 are 121 = 128 - R apart, one too many.
      {"a range one field too wide", {Bits(1.0f), 0x03010000u}},
      {"a subnormal beside a large value", {0x00010000u, Bits(1e20f)}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string block = EncodeLossless(DType::kF32, c.values.data(), c.values.size());
    EXPECT_EQ(InspectBlock(AsBytes(block))->policy.mode, Mode::kLossless);
    ExpectBitExact(DType::kF32, c.values, block);
  }
  // Within the range, and subnormals where the largest value is below 2, it is trimmed.
  const std::vector<uint32_t> ok = {Bits(1.0f), Bits(1e-20f) & 0xffff0000u, 0x00010000u,
                                    0x03810000u};  // field 7: 120 = 127 - R below 1.0
  const std::string block = EncodeLossless(DType::kF32, ok.data(), ok.size());
  EXPECT_EQ(InspectBlock(AsBytes(block))->policy.mode, Mode::kNearLossless);
  ExpectBitExact(DType::kF32, ok, block);
}

// Random blocks of every dtype with random unused low bits, signs, zeros, subnormals,
// non-finite values and ranges: every one decodes to its input bits, trimmed or not.
template <typename U>
void RandomTrimmedBlocks(DType dtype, int mant_bits, uint32_t seed) {
  std::mt19937 rng(seed);
  int trimmed = 0;
  for (int round = 0; round < 300; ++round) {
    const size_t n = 1 + rng() % 3000;
    const int unused = static_cast<int>(rng() % (mant_bits + 1));
    const U mask = static_cast<U>(~((uint64_t{1} << unused) - 1));
    const bool specials = rng() % 4 == 0;  // NaN, -0.0 and subnormals in some blocks
    const int spread = 1 + static_cast<int>(rng() % (rng() % 4 == 0 ? 250 : 100));
    const int top = static_cast<int>(rng() % (mant_bits == 10 ? 31 : 255));
    std::vector<U> in(n);
    for (U& u : in) {
      const uint32_t kind = specials ? rng() % 1000 : 200 + rng() % 800;
      const int e = std::max(0, top - static_cast<int>(rng() % spread));
      U v = static_cast<U>((static_cast<uint64_t>(e) << mant_bits) |
                           (rng() & ((uint64_t{1} << mant_bits) - 1)));
      if (kind < 100) v = 0;
      if (kind == 100) v = static_cast<U>(~U{0} >> 1);                   // NaN, every payload bit
      if (kind == 101) v = static_cast<U>(U{1} << (8 * sizeof(U) - 1));  // -0.0
      if (kind == 102) v = static_cast<U>(rng() & ((1u << mant_bits) - 1));  // subnormal
      if (rng() % 2) v |= static_cast<U>(U{1} << (8 * sizeof(U) - 1));
      u = kind <= 102 && rng() % 4 != 0 ? v : static_cast<U>(v & mask);
    }
    const std::string block = EncodeLossless(dtype, in.data(), n);
    if (InspectBlock(AsBytes(block))->policy.mode == Mode::kNearLossless) ++trimmed;
    ExpectBitExact(dtype, in, block);
    if (::testing::Test::HasFatalFailure()) return;
  }
  EXPECT_GT(trimmed, 20) << "too few random blocks took the trimmed form to test it";
}

TEST(TrimmedLossless, RandomBlocksOfEveryDTypeAreBitExact) {
  RandomTrimmedBlocks<uint32_t>(DType::kF32, 23, 1);
  RandomTrimmedBlocks<uint16_t>(DType::kBF16, 7, 2);
  RandomTrimmedBlocks<uint16_t>(DType::kF16, 10, 3);
}

TEST(Determinism, SameBytesForAnyThreadCount) {
  const std::vector<uint8_t> in = MakeValues(DType::kF32, Pattern::kGradientLike, 100000, 3);
  BufferOptions options;
  options.block_bytes = 4096;
  std::string one, four;
  options.threads = 1;
  ASSERT_TRUE(EncodeBuffer(DType::kF32, in.data(), 100000, options, &one).ok());
  options.threads = 4;
  ASSERT_TRUE(EncodeBuffer(DType::kF32, in.data(), 100000, options, &four).ok());
  EXPECT_EQ(one, four);
  std::string again;
  ASSERT_TRUE(EncodeBuffer(DType::kF32, in.data(), 100000, options, &again).ok());
  EXPECT_EQ(one, again);
}

// EncodeBufferTo hands over the same bytes as EncodeBuffer: blocks in order, one after
// another from the end of the header, and the header last at offset 0.
TEST(FrameSink, SameBytesAsTheStringBlocksInOrderHeaderLast) {
  const std::vector<uint8_t> in = MakeValues(DType::kF32, Pattern::kGradientLike, 100000, 9);
  for (int threads : {1, 4}) {
    BufferOptions options;
    options.block_bytes = 4096;
    options.threads = threads;
    std::string want;
    ASSERT_TRUE(EncodeBuffer(DType::kF32, in.data(), 100000, options, &want).ok());
    const size_t header = FrameHeaderBytes(100000, DType::kF32, options.block_bytes);
    std::string got(header, '\0');
    std::vector<uint64_t> offsets;
    absl::Status st = EncodeBufferTo(
        DType::kF32, in.data(), 100000, options,
        [&](uint64_t offset, absl::Span<const uint8_t> bytes) {
          offsets.push_back(offset);
          const char* p = reinterpret_cast<const char*>(bytes.data());
          if (offset == 0) {
            EXPECT_EQ(bytes.size(), header);
            got.replace(0, bytes.size(), p, bytes.size());
          } else {
            EXPECT_EQ(offset, got.size()) << "blocks must arrive in order, back to back";
            got.append(p, bytes.size());
          }
          return absl::OkStatus();
        });
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(got, want) << threads << " threads";
    ASSERT_EQ(offsets.size(), 100000 * 4 / 4096 + 1 + 1);  // 98 blocks (even) + the header
    EXPECT_EQ(offsets.front(), header);
    EXPECT_EQ(offsets.back(), 0u);
  }
}

TEST(FrameSink, ASinkErrorStopsTheFrameAndIsReturned) {
  const std::vector<uint8_t> in = MakeValues(DType::kF32, Pattern::kGradientLike, 100000, 9);
  for (int threads : {1, 4}) {
    BufferOptions options;
    options.block_bytes = 4096;
    options.threads = threads;
    int calls = 0;
    absl::Status st = EncodeBufferTo(DType::kF32, in.data(), 100000, options,
                                     [&](uint64_t, absl::Span<const uint8_t>) {
                                       return ++calls == 3 ? absl::DataLossError("disk full")
                                                           : absl::OkStatus();
                                     });
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(st.message(), "disk full");
    EXPECT_EQ(calls, 3) << "no block (nor the header) after the error";
  }
  // An invalid policy is refused before the sink sees anything.
  BufferOptions bad;
  bad.policy.rel_bits = 99;
  bool called = false;
  absl::Status st = EncodeBufferTo(DType::kF32, in.data(), 1000, bad,
                                   [&](uint64_t, absl::Span<const uint8_t>) {
                                     called = true;
                                     return absl::OkStatus();
                                   });
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(called);
}

// A frame's blocks are at most block_bytes, as equal as the count allows, even in number
// when there are several, and as FrameLayoutOf says; appending to a non-empty string keeps
// what was there.
TEST(Frame, EqualBlocksOfAtMostTheBlockSize) {
  const std::vector<uint8_t> in = MakeValues(DType::kF32, Pattern::kGradientLike, 20000, 5);
  for (size_t n : {size_t{1}, size_t{999}, size_t{1000}, size_t{1001}, size_t{2999}, size_t{3001},
                   size_t{7000}, size_t{20000}}) {
    BufferOptions options;
    options.block_bytes = 1000 * 4;
    options.threads = 2;
    std::string frame = "prefix";
    ASSERT_TRUE(EncodeBuffer(DType::kF32, in.data(), n, options, &frame).ok());
    ASSERT_EQ(frame.substr(0, 6), "prefix");
    EXPECT_LE(frame.size() - 6, MaxEncodedBytes(n, DType::kF32, options.block_bytes));
    absl::StatusOr<FrameInfo> info = InspectFrame(AsBytes(frame).subspan(6));
    ASSERT_TRUE(info.ok()) << info.status();
    const size_t count = info->blocks.size();
    // FrameLayoutOf predicts the cut without encoding.
    const FrameLayout layout = FrameLayoutOf(n, DType::kF32, options.block_bytes);
    EXPECT_EQ(layout.block_elements, info->block_elements) << n;
    EXPECT_EQ(layout.blocks, count) << n;
    EXPECT_LE(info->block_elements, 1000u) << n;
    EXPECT_EQ(count, (n + info->block_elements - 1) / info->block_elements) << n;
    if (count > 1) {
      EXPECT_EQ(count % 2, 0u) << n;
      // The last block is short by less than one element per block.
      EXPECT_LT(count * info->block_elements - n, count) << n;
    }
    std::vector<float> out(n);
    ASSERT_TRUE(DecodeBuffer(AsBytes(frame).subspan(6), DType::kF32, out.data(), n, 2).ok());
  }
}

TEST(Api, RejectsMismatches) {
  const std::vector<float> in(100, 1.f);
  std::string block;
  ASSERT_TRUE(EncodeBlock(DType::kF32, in.data(), in.size(), Policy(), &block).ok());
  std::vector<float> out(100);
  EXPECT_EQ(DecodeBlock(AsBytes(block), DType::kF32, out.data(), 99).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeBlock(AsBytes(block), DType::kBF16, out.data(), 100).code(),
            absl::StatusCode::kInvalidArgument);
  Policy bad;
  bad.rel_bits = 24;
  EXPECT_FALSE(EncodeBlock(DType::kF32, in.data(), in.size(), bad, &block).ok());
  bad = Policy();
  bad.abs_log2 = 1;
  EXPECT_FALSE(ValidatePolicy(bad).ok());
  EXPECT_EQ(*ParseMode("lossless"), Mode::kLossless);
  EXPECT_EQ(*ParseMode("near-lossless"), Mode::kNearLossless);
  EXPECT_FALSE(ParseMode("lossy").ok());
  EXPECT_EQ(*ParseDType("bf16"), DType::kBF16);
  EXPECT_FALSE(ParseDType("f64").ok());
}

TEST(SharedTable, ReferencedTableRoundTripsAndUnknownIsNotFound) {
  const std::vector<uint8_t> in = MakeValues(DType::kF32, Pattern::kGradientLike, 20000, 9);
  absl::StatusOr<CodeTable> table = CodeTable::Build(DType::kF32, in.data(), 20000, Policy());
  ASSERT_TRUE(table.ok()) << table.status();
  BlockEncodeOptions options;
  options.shared_table = &*table;
  std::string block;
  ASSERT_TRUE(EncodeBlock(DType::kF32, in.data(), 20000, options, &block).ok());
  absl::StatusOr<BlockInfo> info = InspectBlock(AsBytes(block));
  ASSERT_TRUE(info.ok());
  ASSERT_EQ(info->table, TableKind::kReference);
  EXPECT_EQ(info->table_id, table->id());
  EXPECT_EQ(info->table_bytes, 8u);

  std::vector<float> out(20000);
  EXPECT_EQ(DecodeBlock(AsBytes(block), DType::kF32, out.data(), 20000).code(),
            absl::StatusCode::kNotFound);
  CodeTableStore store;
  BlockDecodeOptions decode;
  decode.tables = &store;
  EXPECT_EQ(DecodeBlock(AsBytes(block), DType::kF32, out.data(), 20000, decode).code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<CodeTable> parsed = CodeTable::Parse(DType::kF32, AsBytes(table->bytes()));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(store.Add(*parsed), table->id());
  ASSERT_TRUE(DecodeBlock(AsBytes(block), DType::kF32, out.data(), 20000, decode).ok());

  // Same values as decoding a block that carries its own table.
  std::string inline_block;
  ASSERT_TRUE(EncodeBlock(DType::kF32, in.data(), 20000, Policy(), &inline_block).ok());
  std::vector<float> expect(20000);
  ASSERT_TRUE(DecodeBlock(AsBytes(inline_block), DType::kF32, expect.data(), 20000).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), expect.data(), 20000 * 4));
}

}  // namespace
}  // namespace gcomp::codec
