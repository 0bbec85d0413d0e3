#include "worker/device_chunks.h"

#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "gpu/codec.h"
#include "gpu/runtime.h"

namespace gcomp::worker {
namespace {

size_t RoundUp8(size_t n) { return (n + 7) & ~size_t{7}; }

}  // namespace

absl::StatusOr<std::vector<std::string>> EncodeDeviceChunks(const cluster::DirectionCodec& dc,
                                                            codec::DType dtype,
                                                            const void* input_dev,
                                                            const cluster::ChunkLayout& layout) {
  const size_t esize = codec::DTypeBytes(dtype);
  const size_t num = layout.num_chunks;
  std::vector<std::string> out(num);
  absl::StatusOr<gpu::CudaStream> stream = gpu::CudaStream::Create();
  if (!stream.ok()) return stream.status();
  const char* in = static_cast<const char*>(input_dev);
  if (dc.raw) {
    for (size_t c = 0; c < num; ++c) {
      out[c].resize(layout.size(c) * esize);
      absl::Status s = gpu::CudaStatus(
          cudaMemcpyAsync(out[c].data(), in + layout.begin(c) * esize, out[c].size(),
                          cudaMemcpyDeviceToHost, stream->get()),
          "copying a raw chunk to the host");
      if (!s.ok()) return s;
    }
    if (absl::Status s = stream->Synchronize(); !s.ok()) return s;
    return out;
  }
  // One output area per chunk, 8-byte aligned as the GPU encoder requires.
  std::vector<size_t> offset(num + 1, 0);
  for (size_t c = 0; c < num; ++c) {
    offset[c + 1] = offset[c] + RoundUp8(gpu::BlockOutputBytes(layout.size(c), dtype));
  }
  absl::StatusOr<gpu::DeviceBuffer> blocks_dev = gpu::DeviceBuffer::Allocate(offset[num]);
  absl::StatusOr<gpu::DeviceBuffer> sizes_dev =
      gpu::DeviceBuffer::Allocate(num * sizeof(uint32_t));
  if (!blocks_dev.ok()) return blocks_dev.status();
  if (!sizes_dev.ok()) return sizes_dev.status();
  std::vector<gpu::EncodeChunk> chunks(num);
  for (size_t c = 0; c < num; ++c) {
    chunks[c].in_dev = in + layout.begin(c) * esize;
    chunks[c].elements = static_cast<uint32_t>(layout.size(c));
    chunks[c].out_dev = static_cast<char*>(blocks_dev->data()) + offset[c];
  }
  uint32_t* sizes = static_cast<uint32_t*>(sizes_dev->data());
  if (absl::Status s = gpu::EncodeBatchAsync(dtype, dc.policy, chunks, sizes, stream->get());
      !s.ok()) {
    return s;
  }
  std::vector<uint32_t> host_sizes(num);
  if (absl::Status s = gpu::CudaStatus(
          cudaMemcpyAsync(host_sizes.data(), sizes, num * sizeof(uint32_t),
                          cudaMemcpyDeviceToHost, stream->get()),
          "copying block sizes to the host");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = stream->Synchronize(); !s.ok()) return s;
  for (size_t c = 0; c < num; ++c) {
    if (host_sizes[c] > offset[c + 1] - offset[c]) {
      return absl::InternalError(absl::StrCat("GPU encoder reported ", host_sizes[c],
                                              " bytes for chunk ", c, ", over its bound"));
    }
    out[c].resize(host_sizes[c]);
    absl::Status s = gpu::CudaStatus(
        cudaMemcpyAsync(out[c].data(), chunks[c].out_dev, host_sizes[c],
                        cudaMemcpyDeviceToHost, stream->get()),
        "copying an encoded chunk to the host");
    if (!s.ok()) return s;
  }
  if (absl::Status s = stream->Synchronize(); !s.ok()) return s;
  return out;
}

absl::Status DecodeDeviceChunks(codec::DType dtype,
                                absl::Span<const proto::CompressedBlock> blocks,
                                const cluster::ChunkLayout& layout, void* output_dev) {
  const size_t esize = codec::DTypeBytes(dtype);
  const size_t num = layout.num_chunks;
  if (blocks.size() != num) return absl::InternalError("one reply per chunk expected");
  absl::StatusOr<gpu::CudaStream> stream = gpu::CudaStream::Create();
  if (!stream.ok()) return stream.status();
  char* out = static_cast<char*>(output_dev);
  // Raw replies are copied; GComp ones go to the device in one buffer and decode in a batch.
  std::vector<size_t> offset(num + 1, 0);
  for (size_t c = 0; c < num; ++c) {
    const bool raw = blocks[c].codec() == proto::CODEC_RAW;
    offset[c + 1] = offset[c] + (raw ? 0 : blocks[c].data().size());
  }
  std::string staged(offset[num], '\0');
  std::vector<uint32_t> sizes;
  std::vector<gpu::DecodeChunk> chunks;
  std::vector<size_t> chunk_of;
  for (size_t c = 0; c < num; ++c) {
    const std::string& data = blocks[c].data();
    if (blocks[c].codec() == proto::CODEC_RAW) {
      absl::Status s = gpu::CudaStatus(
          cudaMemcpyAsync(out + layout.begin(c) * esize, data.data(), data.size(),
                          cudaMemcpyHostToDevice, stream->get()),
          "copying a raw reply to the device");
      if (!s.ok()) return s;
      continue;
    }
    std::memcpy(staged.data() + offset[c], data.data(), data.size());
    sizes.push_back(static_cast<uint32_t>(data.size()));
    chunk_of.push_back(c);
  }
  if (!chunk_of.empty()) {
    absl::StatusOr<gpu::DeviceBuffer> staged_dev = gpu::DeviceBuffer::Allocate(staged.size());
    absl::StatusOr<gpu::DeviceBuffer> sizes_dev =
        gpu::DeviceBuffer::Allocate(sizes.size() * sizeof(uint32_t));
    if (!staged_dev.ok()) return staged_dev.status();
    if (!sizes_dev.ok()) return sizes_dev.status();
    for (absl::Status s :
         {gpu::CudaStatus(cudaMemcpyAsync(staged_dev->data(), staged.data(), staged.size(),
                                          cudaMemcpyHostToDevice, stream->get()),
                          "copying replies to the device"),
          gpu::CudaStatus(cudaMemcpyAsync(sizes_dev->data(), sizes.data(),
                                          sizes.size() * sizeof(uint32_t),
                                          cudaMemcpyHostToDevice, stream->get()),
                          "copying reply sizes to the device")}) {
      if (!s.ok()) return s;
    }
    for (size_t i = 0; i < chunk_of.size(); ++i) {
      const size_t c = chunk_of[i];
      gpu::DecodeChunk d;
      d.in_dev = static_cast<const char*>(staged_dev->data()) + offset[c];
      d.elements = static_cast<uint32_t>(layout.size(c));
      d.out_dev = out + layout.begin(c) * esize;
      chunks.push_back(d);
    }
    absl::Status s = gpu::DecodeBatchAsync(
        dtype, chunks, static_cast<const uint32_t*>(sizes_dev->data()), stream->get());
    if (!s.ok()) return s;  // DecodeBatchAsync waits for the stream, so the buffers may go
  }
  return stream->Synchronize();
}

}  // namespace gcomp::worker
