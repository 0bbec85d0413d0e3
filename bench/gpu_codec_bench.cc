// Encode and decode throughput of the CUDA codec per dtype and mode, next to a device-to-device
// cudaMemcpyAsync of the same input measured in the same run. GB/s count uncompressed input
// bytes (for memcpy: bytes copied) per second. Without a device it prints one line and exits 0.
//
//   gpu_codec_bench [--mib=256] [--chunk_kib=1024] [--iters=10]
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "codec/codec.h"
#include "gpu/codec.h"
#include "gpu/runtime.h"

ABSL_FLAG(int, mib, 256, "f32 input size in MiB (16-bit dtypes use the same element count)");
ABSL_FLAG(int, chunk_kib, 1024, "f32 input per block in KiB");
ABSL_FLAG(int, iters, 10, "timed iterations per measurement");

namespace gcomp::gpu {
namespace {

// Owns one CUDA event; move-only.
class CudaEvent {
 public:
  CudaEvent() { cudaEventCreate(&event_); }
  CudaEvent(CudaEvent&& o) noexcept : event_(std::exchange(o.event_, nullptr)) {}
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  CudaEvent& operator=(CudaEvent&&) = delete;
  ~CudaEvent() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds per call of `body` on `stream`, averaged over `iters` after one warm-up.
template <typename F>
absl::StatusOr<double> TimeMs(cudaStream_t stream, int iters, F&& body) {
  if (absl::Status s = body(); !s.ok()) return s;
  CudaEvent start, stop;
  cudaEventRecord(start.get(), stream);
  for (int i = 0; i < iters; ++i) {
    if (absl::Status s = body(); !s.ok()) return s;
  }
  cudaEventRecord(stop.get(), stream);
  if (absl::Status s = CudaStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize");
      !s.ok()) {
    return s;
  }
  float ms = 0;
  cudaEventElapsedTime(&ms, start.get(), stop.get());
  return ms / iters;
}

// Gradient-like f32: a third zeros, the rest normal * 2^[-30, 2].
std::vector<float> GradientLike(size_t n) {
  std::vector<float> v(n);
  std::mt19937_64 rng(1);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_int_distribution<int> scale(-30, 2);
  for (float& x : v) x = rng() % 3 == 0 ? 0.f : std::ldexp(normal(rng), scale(rng));
  return v;
}

absl::Status Run() {
  if (!Available()) {
    std::printf("gpu_codec_bench: no GPU (%s); nothing measured\n",
                std::string(AvailabilityStatus().message()).c_str());
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo();
  if (!info.ok()) return info.status();
  const size_t n = size_t(absl::GetFlag(FLAGS_mib)) << 18;  // f32 elements
  const size_t per_chunk = size_t(absl::GetFlag(FLAGS_chunk_kib)) << 8;
  const int iters = absl::GetFlag(FLAGS_iters);
  const std::vector<float> f32 = GradientLike(n);
  absl::StatusOr<CudaStream> stream = CudaStream::Create();
  if (!stream.ok()) return stream.status();
  std::printf("device: %s (sm_%d%d), input %zu MiB f32 (%zu elements), blocks of %zu elements\n",
              info->name.c_str(), info->sm_major, info->sm_minor, n >> 18, n, per_chunk);
  std::printf("%-5s %-22s %8s %12s %12s %12s %9s %9s\n", "dtype", "mode", "ratio", "memcpy GB/s",
              "encode GB/s", "decode GB/s", "enc/copy", "dec/copy");
  for (codec::DType dtype : {codec::DType::kF32, codec::DType::kBF16, codec::DType::kF16}) {
    const size_t eb = codec::DTypeBytes(dtype);
    std::vector<uint8_t> host(n * eb);
    codec::FromF32(dtype, f32.data(), n, host.data());
    const size_t chunks = (n + per_chunk - 1) / per_chunk;
    const size_t slot = (gpu::BlockOutputBytes(per_chunk, dtype) + 255) / 256 * 256;
    absl::StatusOr<DeviceBuffer> in = DeviceBuffer::Allocate(host.size());
    absl::StatusOr<DeviceBuffer> copy = DeviceBuffer::Allocate(host.size());
    absl::StatusOr<DeviceBuffer> enc = DeviceBuffer::Allocate(chunks * slot);
    absl::StatusOr<DeviceBuffer> dec = DeviceBuffer::Allocate(host.size());
    absl::StatusOr<DeviceBuffer> sizes = DeviceBuffer::Allocate(chunks * 4);
    absl::StatusOr<DeviceBuffer> status = DeviceBuffer::Allocate(chunks * 4);
    for (auto* b : {&in, &copy, &enc, &dec, &sizes, &status}) {
      if (!b->ok()) return b->status();
    }
    if (absl::Status s = CudaStatus(
            cudaMemcpy(in->data(), host.data(), host.size(), cudaMemcpyHostToDevice), "upload");
        !s.ok()) {
      return s;
    }
    std::vector<EncodeChunk> enc_chunks;
    std::vector<DecodeChunk> dec_chunks;
    for (size_t c = 0; c < chunks; ++c) {
      const size_t lo = c * per_chunk, m = std::min(per_chunk, n - lo);
      uint8_t* block = static_cast<uint8_t*>(enc->data()) + c * slot;
      enc_chunks.push_back({static_cast<uint8_t*>(in->data()) + lo * eb, uint32_t(m), block});
      dec_chunks.push_back({block, uint32_t(m), static_cast<uint8_t*>(dec->data()) + lo * eb});
    }
    cudaStream_t st = stream->get();
    absl::StatusOr<double> copy_ms = TimeMs(st, iters, [&] {
      return CudaStatus(
          cudaMemcpyAsync(copy->data(), in->data(), host.size(), cudaMemcpyDeviceToDevice, st),
          "cudaMemcpyAsync");
    });
    if (!copy_ms.ok()) return copy_ms.status();
    const double gb = double(host.size()) / 1e9;
    for (codec::Mode mode : {codec::Mode::kLossless, codec::Mode::kNearLossless}) {
      codec::Policy policy;
      policy.mode = mode;
      auto* sizes_dev = static_cast<uint32_t*>(sizes->data());
      absl::StatusOr<double> enc_ms =
          TimeMs(st, iters, [&] { return EncodeBatchAsync(dtype, policy, enc_chunks, sizes_dev, st); });
      if (!enc_ms.ok()) return enc_ms.status();
      absl::StatusOr<double> dec_ms = TimeMs(st, iters, [&] {
        return DecodeBatchAsync(dtype, dec_chunks, sizes_dev,
                                static_cast<int32_t*>(status->data()), st);
      });
      if (!dec_ms.ok()) return dec_ms.status();
      if (absl::Status s = GatherDecodeStatus(static_cast<int32_t*>(status->data()), chunks, st);
          !s.ok()) {
        return s;
      }
      std::vector<uint32_t> block_sizes(chunks);
      cudaMemcpy(block_sizes.data(), sizes_dev, chunks * 4, cudaMemcpyDeviceToHost);
      double total = 0;
      for (uint32_t b : block_sizes) total += b;
      if (mode == codec::Mode::kLossless) {
        std::vector<uint8_t> back(host.size());
        cudaMemcpy(back.data(), dec->data(), back.size(), cudaMemcpyDeviceToHost);
        if (back != host) return absl::InternalError("lossless GPU round trip is not exact");
      }
      const double copy_gbs = gb / (*copy_ms / 1e3);
      const double enc_gbs = gb / (*enc_ms / 1e3), dec_gbs = gb / (*dec_ms / 1e3);
      std::printf("%-5s %-22s %8.3f %12.1f %12.1f %12.1f %8.1f%% %8.1f%%\n",
                  std::string(codec::DTypeName(dtype)).c_str(),
                  mode == codec::Mode::kLossless ? "lossless" : "near-lossless R7 A-16",
                  double(host.size()) / total, copy_gbs, enc_gbs, dec_gbs,
                  100 * enc_gbs / copy_gbs, 100 * dec_gbs / copy_gbs);
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace gcomp::gpu

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status s = gcomp::gpu::Run();
  if (!s.ok()) {
    std::fprintf(stderr, "gpu_codec_bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
