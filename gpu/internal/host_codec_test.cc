// Runs the GPU kernels' per-chunk code on the host (no device needed) and checks it against
// the CPU codec: identical block bytes over the codec's grid and the real gradients, decode of
// CPU blocks, and the same accept/reject verdict on damaged and forged blocks. The kernels
// themselves are exercised by gpu/codec_test.cc on a device.
#include "gpu/internal/host_codec.h"

#include <xxhash.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "gpu/codec.h"
#include "gpu/testing/grid.h"
#include "gtest/gtest.h"

namespace gcomp::gpu::internal {
namespace {

using codec::DType;
using testing::GridPatternName;
using testing::GridPolicies;
using testing::GridSizes;
using testing::GridValues;
using testing::PolicyName;

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

// First differing byte, for messages.
size_t FirstDiff(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(HostXxh64, MatchesXxHash) {
  std::mt19937 rng(3);
  std::vector<uint8_t> data(300);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  for (size_t len = 0; len <= data.size(); ++len) {
    for (uint64_t seed : {uint64_t{0}, uint64_t{1}, uint64_t{0x9e3779b97f4a7c15ull}}) {
      ASSERT_EQ(HostXxh64(data.data() + 1, len - (len > 0), seed),
                XXH64(data.data() + 1, len - (len > 0), seed))
          << "len " << len;
    }
  }
}

TEST(HostCodec, GridBytesMatchCpuAndDecodeRoundTrips) {
  size_t cases = 0;
  for (DType dtype : kDTypes) {
    for (const codec::Policy& policy : GridPolicies()) {
      for (size_t n : GridSizes()) {
        for (int pattern = 0; pattern < testing::kNumPatterns; ++pattern) {
          const std::string what = std::string(codec::DTypeName(dtype)) + " " +
                                   PolicyName(policy) + " n=" + std::to_string(n) + " " +
                                   GridPatternName(pattern);
          const std::vector<uint8_t> in = GridValues(dtype, pattern, n, 11 + n + pattern);
          std::string cpu;
          ASSERT_TRUE(testing::CpuBlockAsGpuWrites(dtype, in.data(), n, policy, &cpu).ok()) << what;
          absl::StatusOr<std::string> gpu = HostEncodeBlock(dtype, in.data(), n, policy);
          ASSERT_TRUE(gpu.ok()) << what << ": " << gpu.status();
          ASSERT_EQ(gpu->size(), cpu.size()) << what;
          ASSERT_TRUE(*gpu == cpu) << what << ": first difference at byte " << FirstDiff(*gpu, cpu);
          ASSERT_LE(gpu->size(), gpu::BlockOutputBytes(n, dtype));
          // GPU decode of the (shared) bytes equals CPU decode.
          std::vector<uint8_t> want(in.size()), got(in.size(), 0xCD);
          ASSERT_TRUE(codec::DecodeBlock(codec::AsBytes(cpu), dtype, want.data(), n).ok());
          absl::Status st = HostDecodeBlock(codec::AsBytes(cpu), dtype, got.data(), n);
          ASSERT_TRUE(st.ok()) << what << ": " << st;
          ASSERT_EQ(got, want) << what;
          if (policy.mode == codec::Mode::kLossless) {
            ASSERT_EQ(got, in) << what;
          }
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 3 * GridPolicies().size() * GridSizes().size() * testing::kNumPatterns);
}

// Between two barriers the workers of a CUDA block run in no fixed order; the emulation in
// reverse and shuffled order must give the same bytes and outputs (else: a race).
TEST(HostCodec, BytesDoNotDependOnWorkerOrder) {
  for (DType dtype : kDTypes) {
    for (const codec::Policy& policy : GridPolicies()) {
      for (size_t n : {size_t{65}, size_t{5003}, size_t{100003}}) {
        for (int pattern = 0; pattern < testing::kNumPatterns; ++pattern) {
          const std::vector<uint8_t> in = GridValues(dtype, pattern, n, 3 + pattern);
          absl::StatusOr<std::string> ref = HostEncodeBlock(dtype, in.data(), n, policy);
          ASSERT_TRUE(ref.ok());
          std::vector<uint8_t> ref_out(in.size());
          ASSERT_TRUE(HostDecodeBlock(codec::AsBytes(*ref), dtype, ref_out.data(), n).ok());
          for (WorkerOrder order : {WorkerOrder::kDescending, WorkerOrder::kShuffled}) {
            absl::StatusOr<std::string> got = HostEncodeBlock(dtype, in.data(), n, policy, order);
            ASSERT_TRUE(got.ok());
            ASSERT_TRUE(*got == *ref) << codec::DTypeName(dtype) << " " << PolicyName(policy)
                                      << " n=" << n << " " << GridPatternName(pattern);
            std::vector<uint8_t> out(in.size());
            ASSERT_TRUE(HostDecodeBlock(codec::AsBytes(*ref), dtype, out.data(), n, order).ok());
            ASSERT_EQ(out, ref_out);
          }
        }
      }
    }
  }
}

TEST(HostCodec, LargeBlockBytesMatchCpu) {
  const size_t n = (size_t{1} << 22) + 17;  // segments of 16448 elements
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    for (int pattern : {3, 6}) {
      const std::vector<uint8_t> in = GridValues(dtype, pattern, n, 17);
      for (const codec::Policy& policy : {GridPolicies()[0], GridPolicies()[1]}) {
        std::string cpu;
        ASSERT_TRUE(testing::CpuBlockAsGpuWrites(dtype, in.data(), n, policy, &cpu).ok());
        absl::StatusOr<std::string> gpu = HostEncodeBlock(dtype, in.data(), n, policy);
        ASSERT_TRUE(gpu.ok()) << gpu.status();
        ASSERT_TRUE(*gpu == cpu) << "first difference at byte " << FirstDiff(*gpu, cpu);
        std::vector<uint8_t> want(in.size()), got(in.size());
        ASSERT_TRUE(codec::DecodeBlock(codec::AsBytes(cpu), dtype, want.data(), n).ok());
        ASSERT_TRUE(HostDecodeBlock(codec::AsBytes(cpu), dtype, got.data(), n).ok());
        ASSERT_EQ(got, want);
      }
    }
  }
}

TEST(HostCodec, ZeroMapKindsAndTableKindsAreAllReached) {
  // The grid above is only convincing if it reaches every section kind.
  bool zmap[4] = {}, table[4] = {};
  for (DType dtype : kDTypes) {
    for (const codec::Policy& policy : GridPolicies()) {
      for (int pattern = 0; pattern < testing::kNumPatterns; ++pattern) {
        const std::vector<uint8_t> in = GridValues(dtype, pattern, 5003, 5);
        absl::StatusOr<std::string> gpu = HostEncodeBlock(dtype, in.data(), 5003, policy);
        ASSERT_TRUE(gpu.ok());
        absl::StatusOr<codec::BlockInfo> info = codec::InspectBlock(codec::AsBytes(*gpu));
        ASSERT_TRUE(info.ok()) << info.status();
        zmap[static_cast<int>(info->zero_map)] = true;
        table[static_cast<int>(info->table)] = true;
      }
    }
  }
  EXPECT_TRUE(zmap[0] && zmap[1] && zmap[2] && zmap[3]);
  EXPECT_TRUE(table[0] && table[1] && table[3]);
}

TEST(HostCodec, RealGradientsBytesMatchCpu) {
  constexpr size_t kChunk = size_t{1} << 18;  // 1 MiB of f32, the default block size
  size_t chunks = 0;
  for (DType dtype : kDTypes) {
    absl::StatusOr<std::vector<testing::Chunk>> grads = testing::GradientChunks(dtype, kChunk);
    if (!grads.ok()) GTEST_SKIP() << grads.status().message();
    for (const testing::Chunk& c : *grads) {
      for (const codec::Policy& policy : GridPolicies()) {
        if (policy.rel_bits == 0 || policy.rel_bits == 2) continue;  // keep the run short
        std::string cpu;
        ASSERT_TRUE(
            testing::CpuBlockAsGpuWrites(dtype, c.bytes.data(), c.elements, policy, &cpu).ok());
        absl::StatusOr<std::string> gpu =
            HostEncodeBlock(dtype, c.bytes.data(), c.elements, policy);
        ASSERT_TRUE(gpu.ok()) << gpu.status();
        ASSERT_TRUE(*gpu == cpu) << c.name << " " << codec::DTypeName(dtype) << " "
                                 << PolicyName(policy) << ": sizes " << gpu->size() << " vs "
                                 << cpu.size() << ", first difference at byte "
                                 << FirstDiff(*gpu, cpu);
        std::vector<uint8_t> want(c.bytes.size()), got(c.bytes.size());
        ASSERT_TRUE(codec::DecodeBlock(codec::AsBytes(cpu), dtype, want.data(), c.elements).ok());
        ASSERT_TRUE(HostDecodeBlock(codec::AsBytes(cpu), dtype, got.data(), c.elements).ok());
        ASSERT_EQ(got, want) << c.name;
        ++chunks;
      }
    }
  }
  std::printf("byte-identical real-gradient blocks: %zu\n", chunks);
}

// Same verdict as the CPU decoder on every truncation, on bit flips, and on forged blocks
// (changed bytes with a recomputed checksum, which reach the section checks); where both
// accept, the same output.
TEST(HostCodec, DamagedBlocksGetTheCpuVerdict) {
  std::mt19937 rng(99);
  size_t rejected = 0, accepted = 0;
  for (DType dtype : kDTypes) {
    for (const codec::Policy& policy : {GridPolicies()[0], GridPolicies()[1]}) {
      for (int pattern : {3, 4, 6, 7}) {
        const size_t n = 777;
        const std::vector<uint8_t> in = GridValues(dtype, pattern, n, 21);
        std::string block;
        ASSERT_TRUE(codec::EncodeBlock(dtype, in.data(), n, policy, &block).ok());
        std::vector<std::string> bad;
        for (size_t len = 0; len < block.size(); len += 1 + len / 8) bad.push_back(block.substr(0, len));
        for (int i = 0; i < 40; ++i) {
          std::string b = block;
          b[rng() % b.size()] ^= static_cast<char>(1u << (rng() % 8));
          bad.push_back(b);
        }
        for (size_t pos = 0; pos < block.size(); pos += 1 + (pos >= 56) * (rng() % 9)) {
          if (pos >= 48 && pos < 56) continue;  // the checksum itself
          for (int bit : {0, 3, 7}) {
            std::string b = block;
            b[pos] ^= static_cast<char>(1u << bit);
            testing::FixChecksum(&b);
            bad.push_back(b);
          }
        }
        for (const std::string& b : bad) {
          std::vector<uint8_t> want(in.size()), got(in.size());
          const absl::Status cpu = codec::DecodeBlock(codec::AsBytes(b), dtype, want.data(), n);
          const absl::Status gpu = HostDecodeBlock(codec::AsBytes(b), dtype, got.data(), n);
          ASSERT_EQ(cpu.ok(), gpu.ok()) << "cpu: " << cpu << " gpu: " << gpu;
          if (cpu.ok()) {
            ASSERT_EQ(got, want);
            ++accepted;
          } else {
            ASSERT_EQ(cpu.code(), gpu.code()) << "cpu: " << cpu << " gpu: " << gpu;
            ++rejected;
          }
        }
      }
    }
  }
  EXPECT_GT(rejected, 1000u);
  std::printf("damaged blocks: %zu rejected by both, %zu accepted by both\n", rejected, accepted);
}

TEST(HostCodec, WrongDTypeOrCountIsInvalidArgument) {
  const std::vector<uint8_t> in = GridValues(DType::kF32, 3, 100, 1);
  std::string block;
  ASSERT_TRUE(codec::EncodeBlock(DType::kF32, in.data(), 100, codec::Policy(), &block).ok());
  std::vector<uint8_t> out(400);
  EXPECT_EQ(HostDecodeBlock(codec::AsBytes(block), DType::kF32, out.data(), 99).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HostDecodeBlock(codec::AsBytes(block), DType::kBF16, out.data(), 100).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcomp::gpu::internal
