// CUDA runtime basics for the rest of gpu/: device detection, CUDA errors as
// absl::Status, and move-only RAII owners for streams and device memory.
// Host-only header: it names cudaStream_t but declares no device code.
#ifndef GCOMP_GPU_RUNTIME_H_
#define GCOMP_GPU_RUNTIME_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gcomp::gpu {

// True when a CUDA driver and at least one device are usable. Never aborts: on a
// machine without a GPU or driver it returns false (and remembers the answer).
bool Available();

// Why Available() is false, e.g. "CUDA driver version is insufficient for CUDA
// runtime version"; OK when a device is present.
absl::Status AvailabilityStatus();

// Turns a CUDA error into Internal (or Unavailable for missing devices/drivers),
// naming `what` and CUDA's own message. OK for cudaSuccess.
absl::Status CudaStatus(cudaError_t err, const char* what);

// True when `p` points into CUDA device (or managed) memory, so a caller can pick the GPU
// codec for device tensors and the CPU codec for host ones. False without a device.
bool IsDevicePointer(const void* p);

struct DeviceInfo {
  int device = 0;
  std::string name;
  int sm_major = 0;
  int sm_minor = 0;
  size_t memory_bytes = 0;
};
absl::StatusOr<DeviceInfo> GetDeviceInfo(int device = 0);

// Owns one CUDA stream; move-only.
class CudaStream {
 public:
  static absl::StatusOr<CudaStream> Create();
  CudaStream(CudaStream&& other) noexcept;
  CudaStream& operator=(CudaStream&& other) noexcept;
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;
  ~CudaStream();

  cudaStream_t get() const { return stream_; }
  absl::Status Synchronize() const;

 private:
  explicit CudaStream(cudaStream_t stream) : stream_(stream) {}
  cudaStream_t stream_ = nullptr;
};

// Owns `bytes` of device memory; move-only.
class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_dev_; }
  size_t size() const { return bytes_; }

 private:
  void* data_dev_ = nullptr;
  size_t bytes_ = 0;
};

// Largest |x| over the finite elements of `in_dev` (n floats), written to
// `*out_dev` on `stream` without a host sync. A device-side check of a whole tensor's
// range for callers and tests; the codec finds each block's largest exponent inside its
// own encode kernel and does not use it.
absl::Status MaxAbsFinite(const float* in_dev, size_t n, float* out_dev,
                          cudaStream_t stream);

}  // namespace gcomp::gpu

#endif  // GCOMP_GPU_RUNTIME_H_
