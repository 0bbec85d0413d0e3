// Batch kernels over gpu/internal/block_codec.cuh (one CUDA thread block per chunk), the host
// API of gpu/codec.h, and the host-run entry points of gpu/internal/host_codec.h.
#include "gpu/codec.h"

#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gpu/internal/block_codec.cuh"
#include "gpu/internal/host_codec.h"
#include "gpu/runtime.h"

namespace gcomp::gpu {
namespace {

using internal::BlockPolicy;
using internal::DecodeShared;
using internal::EncodeShared;
using internal::kTeamThreads;

static_assert(kTeamThreads == 256, "symbol tables are filled one worker per symbol");

__host__ __device__ constexpr size_t RoundUp8(size_t v) { return (v + 7) & ~size_t{7}; }

// Per-chunk scratch: exponent symbols (n bytes) and the nonzero bitmap (ceil(n/64) words).
size_t ScratchBytes(size_t n) { return RoundUp8(n) + (n + 63) / 64 * 8; }

struct DevJob {
  const uint8_t* in;
  uint8_t* out;
  uint32_t n;
  uint64_t scratch_off;
};

template <typename U>
__global__ void __launch_bounds__(kTeamThreads)
    EncodeKernel(int dtype_code, BlockPolicy pol, const DevJob* __restrict__ jobs_dev,
                 uint8_t* __restrict__ scratch_dev, uint32_t* __restrict__ out_bytes_dev) {
  __shared__ EncodeShared sh;
  const DevJob j = jobs_dev[blockIdx.x];
  uint8_t* scratch = scratch_dev + j.scratch_off;
  internal::EncodeJob<U> job{reinterpret_cast<const U*>(j.in),
                             j.n,
                             j.out,
                             scratch,
                             reinterpret_cast<uint64_t*>(scratch + RoundUp8(j.n)),
                             out_bytes_dev + blockIdx.x};
  internal::EncodeChunk<U>(internal::DeviceTeam{}, sh, dtype_code, pol, job);
}

template <typename U>
__global__ void __launch_bounds__(kTeamThreads)
    DecodeKernel(int dtype_code, const DevJob* __restrict__ jobs_dev,
                 const uint32_t* __restrict__ in_bytes_dev, uint8_t* __restrict__ scratch_dev,
                 int32_t* __restrict__ status_dev) {
  __shared__ DecodeShared sh;
  const DevJob j = jobs_dev[blockIdx.x];
  uint8_t* scratch = scratch_dev + j.scratch_off;
  internal::DecodeJob<U> job{j.in,
                             in_bytes_dev[blockIdx.x],
                             reinterpret_cast<U*>(j.out),
                             j.n,
                             scratch,
                             reinterpret_cast<uint64_t*>(scratch + RoundUp8(j.n)),
                             status_dev + blockIdx.x};
  internal::DecodeChunk<U>(internal::DeviceTeam{}, sh, dtype_code, job);
}

absl::Status CheckDType(codec::DType dtype) {
  const int code = static_cast<int>(dtype);
  if (code < 1 || code > 3) return absl::InvalidArgumentError(absl::StrCat("bad dtype ", code));
  return absl::OkStatus();
}

bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// Copies the job table to the device and allocates the scratch behind it, stream-ordered.
// Returns the device allocation (freed stream-ordered by FreeAsync) or an error.
absl::StatusOr<uint8_t*> UploadJobs(const std::vector<DevJob>& jobs, size_t scratch_bytes,
                                    cudaStream_t stream) {
  const size_t table_bytes = RoundUp8(jobs.size() * sizeof(DevJob));
  void* mem_dev = nullptr;
  if (absl::Status s = CudaStatus(cudaMallocAsync(&mem_dev, table_bytes + scratch_bytes, stream),
                                  "cudaMallocAsync");
      !s.ok()) {
    return s;
  }
  // From pageable memory the copy is staged before this returns, so `jobs` may go away.
  if (absl::Status s = CudaStatus(cudaMemcpyAsync(mem_dev, jobs.data(), jobs.size() * sizeof(DevJob),
                                                  cudaMemcpyHostToDevice, stream),
                                  "cudaMemcpyAsync(jobs)");
      !s.ok()) {
    cudaFreeAsync(mem_dev, stream);
    return s;
  }
  return static_cast<uint8_t*>(mem_dev);
}

absl::Status FinishLaunch(uint8_t* mem_dev, cudaStream_t stream, const char* what) {
  absl::Status launch = CudaStatus(cudaGetLastError(), what);
  absl::Status free = CudaStatus(cudaFreeAsync(mem_dev, stream), "cudaFreeAsync");
  return launch.ok() ? free : launch;
}

// Pointer checks of one chunk: encode reads elements and writes 8-byte words; decode reads a
// block at any byte and writes elements.
absl::Status CheckPointers(size_t i, const EncodeChunk& c, size_t eb) {
  if ((c.elements > 0 && c.in_dev == nullptr) || c.out_dev == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": null pointer"));
  }
  if (!Aligned(c.in_dev, eb) || !Aligned(c.out_dev, 8)) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk ", i, ": input must be element-aligned, output 8-byte aligned"));
  }
  return absl::OkStatus();
}

absl::Status CheckPointers(size_t i, const DecodeChunk& c, size_t eb) {
  if (c.in_dev == nullptr || (c.elements > 0 && c.out_dev == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": null pointer"));
  }
  if (!Aligned(c.out_dev, eb)) {
    return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": output not element-aligned"));
  }
  return absl::OkStatus();
}

// One job per chunk with its scratch offset, after checking the chunk.
template <typename Chunk>
absl::Status MakeJobs(absl::Span<const Chunk> chunks, size_t eb, std::vector<DevJob>* jobs,
                      size_t* scratch) {
  jobs->resize(chunks.size());
  *scratch = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const Chunk& c = chunks[i];
    if (c.elements > codec::kMaxBlockElements) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", i, ": a block holds at most 2^26 elements, got ", c.elements));
    }
    if (absl::Status s = CheckPointers(i, c, eb); !s.ok()) return s;
    (*jobs)[i] = DevJob{static_cast<const uint8_t*>(c.in_dev), static_cast<uint8_t*>(c.out_dev),
                        c.elements, *scratch};
    *scratch += ScratchBytes(c.elements);
  }
  return absl::OkStatus();
}

}  // namespace

size_t BlockOutputBytes(size_t elements, codec::DType dtype) {
  return RoundUp8(codec::MaxBlockEncodedBytes(elements, dtype));
}

absl::Status EncodeBatchAsync(codec::DType dtype, const codec::Policy& policy,
                         absl::Span<const EncodeChunk> chunks, uint32_t* out_bytes_dev,
                         cudaStream_t stream) {
  if (absl::Status s = codec::ValidatePolicy(policy); !s.ok()) return s;
  if (absl::Status s = CheckDType(dtype); !s.ok()) return s;
  const size_t eb = codec::DTypeBytes(dtype);
  std::vector<DevJob> jobs;
  size_t scratch = 0;
  if (absl::Status s = MakeJobs(chunks, eb, &jobs, &scratch); !s.ok()) return s;
  if (out_bytes_dev == nullptr) return absl::InvalidArgumentError("null out_bytes_dev");
  if (absl::Status s = AvailabilityStatus(); !s.ok()) return s;
  if (chunks.empty()) return absl::OkStatus();
  absl::StatusOr<uint8_t*> mem = UploadJobs(jobs, scratch, stream);
  if (!mem.ok()) return mem.status();
  const auto* jobs_dev = reinterpret_cast<const DevJob*>(*mem);
  uint8_t* scratch_dev = *mem + RoundUp8(jobs.size() * sizeof(DevJob));
  const BlockPolicy pol{static_cast<int>(policy.mode), policy.rel_bits, policy.abs_log2};
  const int code = static_cast<int>(dtype);
  const dim3 grid(static_cast<unsigned>(chunks.size()));
  if (dtype == codec::DType::kF32) {
    EncodeKernel<uint32_t><<<grid, kTeamThreads, 0, stream>>>(code, pol, jobs_dev, scratch_dev,
                                                              out_bytes_dev);
  } else {
    EncodeKernel<uint16_t><<<grid, kTeamThreads, 0, stream>>>(code, pol, jobs_dev, scratch_dev,
                                                              out_bytes_dev);
  }
  return FinishLaunch(*mem, stream, "EncodeKernel launch");
}

absl::Status DecodeBatchAsync(codec::DType dtype, absl::Span<const DecodeChunk> chunks,
                              const uint32_t* in_bytes_dev, int32_t* status_dev,
                              cudaStream_t stream) {
  if (absl::Status s = CheckDType(dtype); !s.ok()) return s;
  const size_t eb = codec::DTypeBytes(dtype);
  std::vector<DevJob> jobs;
  size_t scratch = 0;
  if (absl::Status s = MakeJobs(chunks, eb, &jobs, &scratch); !s.ok()) return s;
  if (in_bytes_dev == nullptr || status_dev == nullptr) {
    return absl::InvalidArgumentError("null in_bytes_dev or status_dev");
  }
  if (absl::Status s = AvailabilityStatus(); !s.ok()) return s;
  if (chunks.empty()) return absl::OkStatus();
  absl::StatusOr<uint8_t*> mem = UploadJobs(jobs, scratch, stream);
  if (!mem.ok()) return mem.status();
  const auto* jobs_dev = reinterpret_cast<const DevJob*>(*mem);
  uint8_t* scratch_dev = *mem + RoundUp8(jobs.size() * sizeof(DevJob));
  const int code = static_cast<int>(dtype);
  const dim3 grid(static_cast<unsigned>(chunks.size()));
  if (dtype == codec::DType::kF32) {
    DecodeKernel<uint32_t><<<grid, kTeamThreads, 0, stream>>>(code, jobs_dev, in_bytes_dev,
                                                              scratch_dev, status_dev);
  } else {
    DecodeKernel<uint16_t><<<grid, kTeamThreads, 0, stream>>>(code, jobs_dev, in_bytes_dev,
                                                              scratch_dev, status_dev);
  }
  return FinishLaunch(*mem, stream, "DecodeKernel launch");
}

absl::Status BlockStatusToStatus(int32_t code, size_t block_index) {
  using internal::BlockStatus;
  const std::string where = absl::StrCat("block ", block_index, ": ");
  switch (static_cast<BlockStatus>(code)) {
    case internal::kBlockOk:
      return absl::OkStatus();
    case internal::kBlockWrongDType:
      return absl::InvalidArgumentError(where + "block holds another dtype");
    case internal::kBlockWrongCount:
      return absl::InvalidArgumentError(where + "block holds another element count");
    case internal::kBlockTableReference:
      return absl::NotFoundError(
          where + "block refers to a shared code table; the GPU decoder holds none");
    case internal::kBlockTooShort:
      return absl::DataLossError(where + "shorter than its 56-byte header");
    case internal::kBlockBadMagic:
      return absl::DataLossError(where + "not a GComp block (bad magic)");
    case internal::kBlockBadVersion:
      return absl::DataLossError(where + "unsupported block format version");
    case internal::kBlockBadDType:
      return absl::DataLossError(where + "bad dtype code");
    case internal::kBlockBadPolicy:
      return absl::DataLossError(where + "bad mode or policy");
    case internal::kBlockBadKind:
      return absl::DataLossError(where + "bad zero map or table kind");
    case internal::kBlockBadEmax:
      return absl::DataLossError(where + "bad largest exponent");
    case internal::kBlockBadCounts:
      return absl::DataLossError(where + "bad element or nonzero count");
    case internal::kBlockBadSizeSum:
      return absl::DataLossError(where + "section sizes do not sum to the block size");
    case internal::kBlockBadSections:
      return absl::DataLossError(where + "section sizes inconsistent with the header");
    case internal::kBlockBadChecksum:
      return absl::DataLossError(where + "block checksum mismatch");
    case internal::kBlockBadTable:
      return absl::DataLossError(where + "bad code table");
    case internal::kBlockBadStream:
      return absl::DataLossError(where + "exponent stream does not end at its last byte");
    case internal::kBlockBadZeroMap:
      return absl::DataLossError(where + "bad zero map");
    case internal::kBlockBadPlane:
      return absl::DataLossError(where + "sign/mantissa plane does not end at its last byte");
    default:
      break;
  }
  return absl::InternalError(absl::StrCat(where, "unknown block status ", code));
}

absl::Status GatherDecodeStatus(const int32_t* status_dev, size_t num_chunks,
                                cudaStream_t stream) {
  if (num_chunks == 0) return absl::OkStatus();
  std::vector<int32_t> codes(num_chunks);
  if (absl::Status s =
          CudaStatus(cudaMemcpyAsync(codes.data(), status_dev, num_chunks * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, stream),
                     "cudaMemcpyAsync(status)");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      !s.ok()) {
    return s;
  }
  for (size_t i = 0; i < num_chunks; ++i) {
    if (codes[i] != internal::kBlockOk) return BlockStatusToStatus(codes[i], i);
  }
  return absl::OkStatus();
}

absl::Status DecodeBatchAsync(codec::DType dtype, absl::Span<const DecodeChunk> chunks,
                         const uint32_t* in_bytes_dev, cudaStream_t stream) {
  if (absl::Status s = AvailabilityStatus(); !s.ok()) return s;
  if (chunks.empty()) return absl::OkStatus();
  void* status_dev = nullptr;
  if (absl::Status s = CudaStatus(
          cudaMallocAsync(&status_dev, chunks.size() * sizeof(int32_t), stream), "cudaMallocAsync");
      !s.ok()) {
    return s;
  }
  const absl::Status launched = DecodeBatchAsync(dtype, chunks, in_bytes_dev,
                                                 static_cast<int32_t*>(status_dev), stream);
  const absl::Status gathered =
      launched.ok() ? GatherDecodeStatus(static_cast<int32_t*>(status_dev), chunks.size(), stream)
                    : launched;
  cudaFreeAsync(status_dev, stream);
  return gathered;
}

// ---------------------------------------------------------------------------------------------
// Host-run entry points (tests).

namespace internal {
namespace {

HostTeam MakeHostTeam(WorkerOrder order, std::vector<int>* ids) {
  if (order == WorkerOrder::kAscending) return HostTeam{};
  ids->resize(kTeamThreads);
  for (int t = 0; t < kTeamThreads; ++t) (*ids)[t] = kTeamThreads - 1 - t;
  if (order == WorkerOrder::kShuffled) {
    uint32_t x = 12345;  // fixed LCG: reproducible
    for (int t = kTeamThreads - 1; t > 0; --t) {
      x = x * 1664525u + 1013904223u;
      std::swap((*ids)[t], (*ids)[x % static_cast<uint32_t>(t + 1)]);
    }
  }
  return HostTeam{ids->data()};
}

template <typename U>
absl::StatusOr<std::string> HostEncodeTyped(int code, const void* data, size_t n,
                                            const BlockPolicy& pol, WorkerOrder order) {
  std::vector<U> in(n);
  if (n > 0) std::memcpy(in.data(), data, n * sizeof(U));
  const size_t cap = gpu::BlockOutputBytes(n, static_cast<codec::DType>(code));
  std::vector<uint64_t> out(cap / 8 + 1, 0xA5A5A5A5A5A5A5A5ull);  // garbage: must be rewritten
  std::vector<uint8_t> syms(n + 8);
  std::vector<uint64_t> bitmap((n + 63) / 64 + 1);
  auto sh = std::make_unique<EncodeShared>();
  uint32_t size = 0;
  EncodeJob<U> job{in.data(), static_cast<uint32_t>(n), reinterpret_cast<uint8_t*>(out.data()),
                   syms.data(), bitmap.data(), &size};
  std::vector<int> ids;
  EncodeChunk<U>(MakeHostTeam(order, &ids), *sh, code, pol, job);
  if (size > cap) return absl::InternalError("host-run encoder wrote past its bound");
  // The device writes whole words; none may land past the caller's BlockOutputBytes.
  const uint8_t* bytes = reinterpret_cast<const uint8_t*>(out.data());
  for (size_t i = cap; i < out.size() * 8; ++i) {
    if (bytes[i] != 0xA5) return absl::InternalError("host-run encoder wrote past its bound");
  }
  return std::string(reinterpret_cast<const char*>(out.data()), size);
}

template <typename U>
absl::Status HostDecodeTyped(int code, absl::Span<const uint8_t> block, void* out, size_t n,
                             WorkerOrder order) {
  std::vector<U> dec(n);
  std::vector<uint8_t> syms(n + 8);
  std::vector<uint64_t> bitmap((n + 63) / 64 + 1);
  auto sh = std::make_unique<DecodeShared>();
  int32_t status = -1;
  DecodeJob<U> job{block.data(), static_cast<uint32_t>(block.size()), dec.data(),
                   static_cast<uint32_t>(n), syms.data(), bitmap.data(), &status};
  std::vector<int> ids;
  DecodeChunk<U>(MakeHostTeam(order, &ids), *sh, code, job);
  if (status != kBlockOk) return BlockStatusToStatus(status, 0);
  if (n > 0) std::memcpy(out, dec.data(), n * sizeof(U));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> HostEncodeBlock(codec::DType dtype, const void* data, size_t n,
                                            const codec::Policy& policy, WorkerOrder order) {
  if (absl::Status s = codec::ValidatePolicy(policy); !s.ok()) return s;
  if (absl::Status s = CheckDType(dtype); !s.ok()) return s;
  if (n > codec::kMaxBlockElements) return absl::InvalidArgumentError("too many elements");
  const BlockPolicy pol{static_cast<int>(policy.mode), policy.rel_bits, policy.abs_log2};
  const int code = static_cast<int>(dtype);
  if (dtype == codec::DType::kF32) return HostEncodeTyped<uint32_t>(code, data, n, pol, order);
  return HostEncodeTyped<uint16_t>(code, data, n, pol, order);
}

absl::Status HostDecodeBlock(absl::Span<const uint8_t> block, codec::DType dtype, void* out,
                             size_t n, WorkerOrder order) {
  if (absl::Status s = CheckDType(dtype); !s.ok()) return s;
  if (n > codec::kMaxBlockElements) return absl::InvalidArgumentError("too many elements");
  if (block.size() > UINT32_MAX) return absl::InvalidArgumentError("block too large");
  const int code = static_cast<int>(dtype);
  if (dtype == codec::DType::kF32) return HostDecodeTyped<uint32_t>(code, block, out, n, order);
  return HostDecodeTyped<uint16_t>(code, block, out, n, order);
}

uint64_t HostXxh64(const void* data, size_t len, uint64_t seed) {
  return Xxh64(static_cast<const uint8_t*>(data), len, seed);
}

}  // namespace internal
}  // namespace gcomp::gpu
