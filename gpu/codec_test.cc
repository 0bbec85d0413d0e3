// The CUDA codec against the CPU codec, on a device: identical bytes for the codec's grid and
// the real gradients (one batch per dtype x policy), GPU decode of CPU blocks, CPU decode of
// GPU blocks, and damaged blocks rejected per block. Without a device every case skips.
#include "gpu/codec.h"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "gpu/runtime.h"
#include "gpu/testing/grid.h"
#include "gtest/gtest.h"

namespace gcomp::gpu {
namespace {

using codec::DType;

#define GCOMP_REQUIRE_GPU()                                         \
  do {                                                              \
    if (!Available()) {                                             \
      GTEST_SKIP() << "no GPU: " << AvailabilityStatus().message(); \
    }                                                               \
  } while (0)

constexpr DType kDTypes[] = {DType::kF32, DType::kBF16, DType::kF16};

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

struct Input {
  std::string name;
  std::vector<uint8_t> bytes;
  size_t elements;
};

std::vector<Input> GridInputs(DType dtype) {
  std::vector<Input> out;
  for (size_t n : testing::GridSizes()) {
    for (int p = 0; p < testing::kNumPatterns; ++p) {
      out.push_back({"n=" + std::to_string(n) + " " + testing::GridPatternName(p),
                     testing::GridValues(dtype, p, n, 11 + n + p), n});
    }
  }
  return out;
}

// Uploads the inputs into one device buffer (each at an aligned offset), encodes them in one
// batch, and returns the blocks.
void GpuEncode(DType dtype, const codec::Policy& policy, const std::vector<Input>& inputs,
               const CudaStream& stream, std::vector<std::string>* blocks) {
  std::vector<size_t> in_off, out_off;
  size_t in_total = 0, out_total = 0;
  for (const Input& in : inputs) {
    in_off.push_back(in_total);
    in_total += (in.bytes.size() + 255) / 256 * 256;
    out_off.push_back(out_total);
    out_total += (gpu::BlockOutputBytes(in.elements, dtype) + 255) / 256 * 256;
  }
  auto in_dev = DeviceBuffer::Allocate(in_total + 256);
  auto out_dev = DeviceBuffer::Allocate(out_total + 256);
  auto sizes_dev = DeviceBuffer::Allocate(inputs.size() * 4 + 4);
  ASSERT_TRUE(in_dev.ok() && out_dev.ok() && sizes_dev.ok());
  std::vector<EncodeChunk> chunks;
  for (size_t i = 0; i < inputs.size(); ++i) {
    uint8_t* in_p = static_cast<uint8_t*>(in_dev->data()) + in_off[i];
    if (!inputs[i].bytes.empty()) {
      ASSERT_CUDA(cudaMemcpy(in_p, inputs[i].bytes.data(), inputs[i].bytes.size(),
                             cudaMemcpyHostToDevice));
    }
    chunks.push_back({in_p, static_cast<uint32_t>(inputs[i].elements),
                      static_cast<uint8_t*>(out_dev->data()) + out_off[i]});
  }
  absl::Status st = EncodeBatchAsync(dtype, policy, chunks,
                                static_cast<uint32_t*>(sizes_dev->data()), stream.get());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(stream.Synchronize().ok());
  std::vector<uint32_t> sizes(inputs.size());
  ASSERT_CUDA(cudaMemcpy(sizes.data(), sizes_dev->data(), sizes.size() * 4,
                         cudaMemcpyDeviceToHost));
  std::vector<uint8_t> out(out_total);
  ASSERT_CUDA(cudaMemcpy(out.data(), out_dev->data(), out_total, cudaMemcpyDeviceToHost));
  blocks->clear();
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_LE(sizes[i], gpu::BlockOutputBytes(inputs[i].elements, dtype));
    blocks->emplace_back(reinterpret_cast<const char*>(out.data() + out_off[i]), sizes[i]);
  }
}

// Uploads the blocks back to back (any alignment), decodes them in one batch, and returns
// each block's status and output.
void GpuDecode(DType dtype, const std::vector<std::string>& blocks,
               const std::vector<size_t>& elements, const CudaStream& stream,
               std::vector<absl::Status>* statuses, std::vector<std::vector<uint8_t>>* outputs) {
  const size_t eb = codec::DTypeBytes(dtype);
  std::string all;
  std::vector<size_t> in_off, out_off;
  std::vector<uint32_t> sizes;
  size_t out_total = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    in_off.push_back(all.size());
    all += blocks[i];
    sizes.push_back(static_cast<uint32_t>(blocks[i].size()));
    out_off.push_back(out_total);
    out_total += (elements[i] * eb + 255) / 256 * 256;
  }
  auto in_dev = DeviceBuffer::Allocate(all.size() + 8);
  auto out_dev = DeviceBuffer::Allocate(out_total + 256);
  auto sizes_dev = DeviceBuffer::Allocate(sizes.size() * 4 + 4);
  auto status_dev = DeviceBuffer::Allocate(sizes.size() * 4 + 4);
  ASSERT_TRUE(in_dev.ok() && out_dev.ok() && sizes_dev.ok() && status_dev.ok());
  if (!all.empty()) {
    ASSERT_CUDA(cudaMemcpy(in_dev->data(), all.data(), all.size(), cudaMemcpyHostToDevice));
  }
  ASSERT_CUDA(cudaMemcpy(sizes_dev->data(), sizes.data(), sizes.size() * 4,
                         cudaMemcpyHostToDevice));
  std::vector<DecodeChunk> chunks;
  for (size_t i = 0; i < blocks.size(); ++i) {
    chunks.push_back({static_cast<const uint8_t*>(in_dev->data()) + in_off[i],
                      static_cast<uint32_t>(elements[i]),
                      static_cast<uint8_t*>(out_dev->data()) + out_off[i]});
  }
  auto* status_p = static_cast<int32_t*>(status_dev->data());
  absl::Status st = DecodeBatchAsync(dtype, chunks, static_cast<const uint32_t*>(sizes_dev->data()),
                                     status_p, stream.get());
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_TRUE(stream.Synchronize().ok());
  std::vector<int32_t> codes(blocks.size());
  ASSERT_CUDA(cudaMemcpy(codes.data(), status_p, codes.size() * 4, cudaMemcpyDeviceToHost));
  std::vector<uint8_t> out(out_total);
  ASSERT_CUDA(cudaMemcpy(out.data(), out_dev->data(), out_total, cudaMemcpyDeviceToHost));
  statuses->clear();
  outputs->clear();
  for (size_t i = 0; i < blocks.size(); ++i) {
    statuses->push_back(BlockStatusToStatus(codes[i], i));
    outputs->emplace_back(out.begin() + out_off[i], out.begin() + out_off[i] + elements[i] * eb);
  }
}

void CheckAgainstCpu(DType dtype, const codec::Policy& policy, const std::vector<Input>& inputs,
                     const CudaStream& stream) {
  const std::string what =
      std::string(codec::DTypeName(dtype)) + " " + testing::PolicyName(policy);
  std::vector<std::string> gpu_blocks;
  ASSERT_NO_FATAL_FAILURE(GpuEncode(dtype, policy, inputs, stream, &gpu_blocks));
  std::vector<std::string> cpu_blocks;
  std::vector<size_t> elements;
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::string cpu;
    ASSERT_TRUE(testing::CpuBlockAsGpuWrites(dtype, inputs[i].bytes.data(), inputs[i].elements,
                                             policy, &cpu)
                    .ok());
    ASSERT_TRUE(gpu_blocks[i] == cpu) << what << " " << inputs[i].name << ": GPU block of "
                                      << gpu_blocks[i].size() << " bytes, CPU " << cpu.size();
    cpu_blocks.push_back(std::move(cpu));
    elements.push_back(inputs[i].elements);
  }
  // GPU decode of the CPU blocks equals CPU decode; CPU decode of GPU blocks is implied by
  // the identity above, and checked once more for the record.
  std::vector<absl::Status> statuses;
  std::vector<std::vector<uint8_t>> outputs;
  ASSERT_NO_FATAL_FAILURE(GpuDecode(dtype, cpu_blocks, elements, stream, &statuses, &outputs));
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(statuses[i].ok()) << what << " " << inputs[i].name << ": " << statuses[i];
    std::vector<uint8_t> want(inputs[i].bytes.size());
    ASSERT_TRUE(codec::DecodeBlock(codec::AsBytes(gpu_blocks[i]), dtype, want.data(),
                                   inputs[i].elements)
                    .ok());
    ASSERT_EQ(outputs[i], want) << what << " " << inputs[i].name;
    if (policy.mode == codec::Mode::kLossless) {
      ASSERT_EQ(outputs[i], inputs[i].bytes) << what << " " << inputs[i].name;
    }
  }
}

TEST(GpuCodec, WithoutDeviceAnswersUnavailable) {
  if (Available()) GTEST_SKIP() << "a device is present";
  alignas(8) uint32_t dummy[2] = {0, 0};
  EncodeChunk chunk{dummy, 1, dummy};
  EXPECT_EQ(EncodeBatchAsync(DType::kF32, codec::Policy(), {&chunk, 1}, dummy, nullptr).code(),
            absl::StatusCode::kUnavailable);
  DecodeChunk dchunk{dummy, 1, dummy};
  EXPECT_EQ(DecodeBatchAsync(DType::kF32, {&dchunk, 1}, dummy, nullptr).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(gpu::BlockOutputBytes(3, DType::kF16), 64u);
}

TEST(GpuCodec, GridIsByteIdenticalToCpu) {
  GCOMP_REQUIRE_GPU();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok());
  for (DType dtype : kDTypes) {
    const std::vector<Input> inputs = GridInputs(dtype);
    for (const codec::Policy& policy : testing::GridPolicies()) {
      ASSERT_NO_FATAL_FAILURE(CheckAgainstCpu(dtype, policy, inputs, *stream));
    }
  }
}

TEST(GpuCodec, RealGradientsAreByteIdenticalToCpu) {
  GCOMP_REQUIRE_GPU();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok());
  for (DType dtype : kDTypes) {
    auto grads = testing::GradientChunks(dtype, size_t{1} << 18);
    if (!grads.ok()) GTEST_SKIP() << grads.status().message();
    std::vector<Input> inputs;
    for (testing::Chunk& c : *grads) inputs.push_back({c.name, std::move(c.bytes), c.elements});
    for (const codec::Policy& policy : testing::GridPolicies()) {
      ASSERT_NO_FATAL_FAILURE(CheckAgainstCpu(dtype, policy, inputs, *stream));
    }
  }
}

TEST(GpuCodec, DamagedBlocksAreRejectedPerBlock) {
  GCOMP_REQUIRE_GPU();
  auto stream = CudaStream::Create();
  ASSERT_TRUE(stream.ok());
  std::mt19937 rng(5);
  for (DType dtype : kDTypes) {
    const size_t n = 4000;
    const std::vector<uint8_t> in = testing::GridValues(dtype, 3, n, 8);
    std::string good;
    ASSERT_TRUE(codec::EncodeBlock(dtype, in.data(), n, codec::Policy(), &good).ok());
    std::vector<std::string> blocks;
    std::vector<size_t> elements;
    for (int i = 0; i < 200; ++i) {
      std::string b = good;
      switch (i % 4) {
        case 0: b[rng() % b.size()] ^= static_cast<char>(1 << (rng() % 8)); break;
        case 1: b.resize(rng() % b.size()); break;
        case 2:  // forged: a changed byte with a valid checksum
          b[rng() % b.size()] ^= static_cast<char>(1 << (rng() % 8));
          testing::FixChecksum(&b);
          break;
        default: break;  // intact: must still decode among the bad ones
      }
      blocks.push_back(b);
      elements.push_back(n);
    }
    std::vector<absl::Status> statuses;
    std::vector<std::vector<uint8_t>> outputs;
    ASSERT_NO_FATAL_FAILURE(GpuDecode(dtype, blocks, elements, *stream, &statuses, &outputs));
    for (size_t i = 0; i < blocks.size(); ++i) {
      std::vector<uint8_t> want(in.size());
      const absl::Status cpu = codec::DecodeBlock(codec::AsBytes(blocks[i]), dtype, want.data(), n);
      ASSERT_EQ(cpu.ok(), statuses[i].ok()) << "block " << i << " cpu " << cpu << " gpu "
                                            << statuses[i];
      if (cpu.ok()) {
        ASSERT_EQ(outputs[i], want) << "block " << i;
      } else {
        ASSERT_EQ(cpu.code(), statuses[i].code()) << "block " << i;
      }
    }
    // A wrong element count fails that block alone with InvalidArgument, gathered once.
    auto in_dev = DeviceBuffer::Allocate(good.size());
    auto out_dev = DeviceBuffer::Allocate(2 * n * 4);
    auto sizes_dev = DeviceBuffer::Allocate(8);
    ASSERT_TRUE(in_dev.ok() && out_dev.ok() && sizes_dev.ok());
    ASSERT_CUDA(cudaMemcpy(in_dev->data(), good.data(), good.size(), cudaMemcpyHostToDevice));
    const uint32_t sizes[2] = {static_cast<uint32_t>(good.size()),
                               static_cast<uint32_t>(good.size())};
    ASSERT_CUDA(cudaMemcpy(sizes_dev->data(), sizes, 8, cudaMemcpyHostToDevice));
    DecodeChunk chunks[2] = {{in_dev->data(), static_cast<uint32_t>(n), out_dev->data()},
                             {in_dev->data(), static_cast<uint32_t>(n - 1),
                              static_cast<uint8_t*>(out_dev->data()) + n * 4}};
    absl::Status st = DecodeBatchAsync(dtype, chunks, static_cast<const uint32_t*>(sizes_dev->data()),
                                  stream->get());
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("block 1"), absl::string_view::npos) << st;
  }
}

}  // namespace
}  // namespace gcomp::gpu
