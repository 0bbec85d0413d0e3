#include "gpu/runtime.h"

#include <cuda_runtime.h>
#include <unistd.h>  // access

#include <string>
#include <utility>

#include "gpu/max_abs.cuh"

namespace gcomp::gpu {
namespace {

absl::Status ProbeOnce() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    // The runtime reports a machine without any NVIDIA driver as "driver version is
    // insufficient" (or a stub library's error), which sends people looking for an upgrade.
    if (access("/proc/driver/nvidia/version", F_OK) != 0) {
      return absl::UnavailableError(
          "no usable CUDA device: no NVIDIA driver is loaded on this machine (no "
          "/proc/driver/nvidia/version; the CUDA runtime says: " +
          std::string(cudaGetErrorString(err)) + ")");
    }
    return absl::UnavailableError(std::string("no usable CUDA device: ") +
                                  cudaGetErrorString(err));
  }
  if (count == 0) return absl::UnavailableError("no CUDA device present");
  return absl::OkStatus();
}

}  // namespace

absl::Status AvailabilityStatus() {
  static const absl::Status* const status = new absl::Status(ProbeOnce());
  return *status;
}

bool Available() { return AvailabilityStatus().ok(); }

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message =
      std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    return absl::UnavailableError(message);
  }
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

bool IsDevicePointer(const void* p) {
  if (p == nullptr || !Available()) return false;
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // unregistered host memory on old runtimes: not an error for us
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) {
  if (absl::Status s = AvailabilityStatus(); !s.ok()) return s;
  cudaDeviceProp prop;
  if (absl::Status s = CudaStatus(cudaGetDeviceProperties(&prop, device),
                                  "cudaGetDeviceProperties");
      !s.ok()) {
    return s;
  }
  DeviceInfo info;
  info.device = device;
  info.name = prop.name;
  info.sm_major = prop.major;
  info.sm_minor = prop.minor;
  info.memory_bytes = prop.totalGlobalMem;
  return info;
}

absl::StatusOr<CudaStream> CudaStream::Create() {
  if (absl::Status s = AvailabilityStatus(); !s.ok()) return s;
  cudaStream_t stream = nullptr;
  if (absl::Status s = CudaStatus(
          cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      !s.ok()) {
    return s;
  }
  return CudaStream(stream);
}

CudaStream::CudaStream(CudaStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)) {}

CudaStream& CudaStream::operator=(CudaStream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

CudaStream::~CudaStream() {
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status CudaStream::Synchronize() const {
  return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

absl::StatusOr<DeviceBuffer> DeviceBuffer::Allocate(size_t bytes) {
  if (absl::Status s = AvailabilityStatus(); !s.ok()) return s;
  DeviceBuffer buffer;
  if (bytes == 0) return buffer;
  if (absl::Status s = CudaStatus(cudaMalloc(&buffer.data_dev_, bytes), "cudaMalloc");
      !s.ok()) {
    return s;
  }
  buffer.bytes_ = bytes;
  return buffer;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_dev_(std::exchange(other.data_dev_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_dev_ != nullptr) cudaFree(data_dev_);
    data_dev_ = std::exchange(other.data_dev_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_dev_ != nullptr) cudaFree(data_dev_);
}

absl::Status MaxAbsFinite(const float* in_dev, size_t n, float* out_dev,
                          cudaStream_t stream) {
  unsigned int* out_bits_dev = reinterpret_cast<unsigned int*>(out_dev);
  if (absl::Status s = CudaStatus(
          cudaMemsetAsync(out_bits_dev, 0, sizeof(unsigned int), stream), "cudaMemsetAsync");
      !s.ok()) {
    return s;
  }
  if (n == 0) return absl::OkStatus();
  constexpr int kThreads = 256;
  const size_t wanted = (n + kThreads - 1) / kThreads;
  const int blocks = static_cast<int>(wanted < 4096 ? wanted : 4096);
  internal::MaxAbsFiniteKernel<<<blocks, kThreads, 0, stream>>>(in_dev, n, out_bits_dev);
  return CudaStatus(cudaGetLastError(), "MaxAbsFiniteKernel launch");
}

}  // namespace gcomp::gpu
