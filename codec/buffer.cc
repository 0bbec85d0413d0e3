// Frames: a buffer cut into blocks, encoded and decoded in parallel. See docs/FORMAT.md.
#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/thread_pool.h"
#include "codec/codec.h"
#include "codec/internal/block_scratch.h"
#include "codec/internal/format.h"
#include "format/endian.h"

namespace gcomp::codec {
namespace {

constexpr size_t kFrameFixedBytes = 24;  // before the block size table

// Runs fn(i) for i < n on the given pool, or on a pool of `threads` made for this call.
void RunParallel(ThreadPool* pool, int threads, size_t n, const std::function<void(size_t)>& fn) {
  if (pool != nullptr) {
    pool->ParallelFor(n, fn);
  } else if (threads <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
  } else {
    ThreadPool local(static_cast<int>(std::min<size_t>(threads, n)) - 1);
    local.ParallelFor(n, fn);
  }
}

}  // namespace

// Blocks are as equal as the element count allows, at most block_bytes each, and there is
// an even number of them when there is more than one, so that 2 (or 4, for the common
// counts) threads get the same amount of work.
FrameLayout FrameLayoutOf(size_t n, DType dtype, size_t block_bytes) {
  FrameLayout l;
  const size_t most = std::clamp<size_t>(block_bytes / DTypeBytes(dtype), 1, kMaxBlockElements);
  if (n == 0) {
    l.block_elements = most;
    return l;
  }
  size_t want = (n + most - 1) / most;
  if (want > 1) want += want % 2;
  l.block_elements = std::max<size_t>(1, (n + want - 1) / want);
  l.blocks = (n + l.block_elements - 1) / l.block_elements;
  return l;
}

size_t MaxEncodedBytes(size_t n, DType dtype, size_t block_bytes) {
  const size_t blocks = FrameLayoutOf(n, dtype, block_bytes).blocks;
  return kFrameFixedBytes + blocks * (4 + kBlockHeaderBytes) + 8 + n * DTypeBytes(dtype);
}

size_t MaxEncodedBytes(size_t n, DType dtype) {
  return MaxEncodedBytes(n, dtype, BufferOptions().block_bytes);
}

size_t FrameHeaderBytes(size_t n, DType dtype, size_t block_bytes) {
  return kFrameFixedBytes + 4 * FrameLayoutOf(n, dtype, block_bytes).blocks + 8;
}

absl::Status EncodeBufferTo(DType dtype, const void* data, size_t n, const BufferOptions& options,
                            const FrameSink& sink) {
  if (!internal::IsValidDType(static_cast<uint8_t>(dtype))) {
    return absl::InvalidArgumentError("bad dtype");
  }
  if (absl::Status st = ValidatePolicy(options.policy); !st.ok()) return st;
  if (n > 0 && data == nullptr) return absl::InvalidArgumentError("null data");
  const FrameLayout layout = FrameLayoutOf(n, dtype, options.block_bytes);
  const size_t per = layout.block_elements, count = layout.blocks;
  if (count > UINT32_MAX) return absl::InvalidArgumentError("too many blocks");
  const size_t elem = DTypeBytes(dtype);
  BlockEncodeOptions block_options;
  block_options.policy = options.policy;
  block_options.shared_table = options.shared_table;
  const size_t header = kFrameFixedBytes + 4 * count + 8;

  // Blocks are encoded in parallel into per-thread scratch memory and handed to the sink in
  // order: the thread that finishes block i waits until block i - 1 is in. Indices are
  // handed out in increasing order and each is worked on at once, so block i - 1 is always
  // underway.
  std::vector<uint32_t> sizes(count);
  absl::Mutex mu;
  size_t appended = 0;       // blocks 0 .. appended - 1 are done
  uint64_t offset = header;  // where the next block goes
  absl::Status status;       // the first error; later blocks are dropped
  RunParallel(options.pool, options.threads, count, [&](size_t i) {
    const size_t lo = i * per, m = std::min(per, n - lo);
    absl::StatusOr<absl::Span<const uint8_t>> block = internal::EncodeBlockToScratch(
        dtype, static_cast<const uint8_t*>(data) + lo * elem, m, block_options);
    absl::MutexLock lock(&mu);
    auto my_turn = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return appended == i; };
    mu.Await(absl::Condition(&my_turn));
    ++appended;
    if (!status.ok()) return;
    if (!block.ok()) {
      status = block.status();
      return;
    }
    status = sink(offset, *block);
    sizes[i] = static_cast<uint32_t>(block->size());
    offset += block->size();
  });
  if (!status.ok()) return status;
  std::vector<uint8_t> head(header);
  uint8_t* h = head.data();
  format::StoreLE32(h, internal::kFrameMagic);
  h[4] = internal::kFrameVersion;
  h[5] = static_cast<uint8_t>(dtype);
  h[6] = h[7] = 0;
  format::StoreLE64(h + 8, n);
  format::StoreLE32(h + 16, static_cast<uint32_t>(per));
  format::StoreLE32(h + 20, static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) format::StoreLE32(h + kFrameFixedBytes + 4 * i, sizes[i]);
  format::StoreLE64(h + header - 8, XXH64(h, header - 8, 0));
  return sink(0, head);
}

absl::Status EncodeBuffer(DType dtype, const void* data, size_t n, const BufferOptions& options,
                          std::string* out) {
  if (!internal::IsValidDType(static_cast<uint8_t>(dtype))) {
    return absl::InvalidArgumentError("bad dtype");
  }
  // With room reserved for the worst case, *out never moves while blocks are appended.
  const size_t base = out->size();
  out->reserve(base + MaxEncodedBytes(n, dtype, options.block_bytes));
  out->resize(base + FrameHeaderBytes(n, dtype, options.block_bytes));
  absl::Status st = EncodeBufferTo(
      dtype, data, n, options, [&](uint64_t offset, absl::Span<const uint8_t> bytes) {
        const char* p = reinterpret_cast<const char*>(bytes.data());
        if (offset == 0) {
          out->replace(base, bytes.size(), p, bytes.size());
        } else {
          out->append(p, bytes.size());
        }
        return absl::OkStatus();
      });
  if (!st.ok()) out->resize(base);
  return st;
}

absl::StatusOr<FrameInfo> InspectFrame(absl::Span<const uint8_t> frame) {
  if (frame.size() < kFrameFixedBytes + 8) {
    return absl::DataLossError(absl::StrCat("frame of ", frame.size(), " bytes is too short"));
  }
  const uint8_t* h = frame.data();
  if (format::LoadLE32(h) != internal::kFrameMagic) {
    return absl::DataLossError("not a GComp frame (bad magic)");
  }
  if (h[4] != internal::kFrameVersion) {
    return absl::DataLossError(absl::StrCat("unsupported frame version ", h[4]));
  }
  if (!internal::IsValidDType(h[5]) || h[6] != 0 || h[7] != 0) {
    return absl::DataLossError("bad frame dtype or reserved bytes");
  }
  FrameInfo info;
  info.dtype = static_cast<DType>(h[5]);
  info.elements = format::LoadLE64(h + 8);
  info.block_elements = format::LoadLE32(h + 16);
  const uint32_t count = format::LoadLE32(h + 20);
  if (info.block_elements == 0 || info.block_elements > kMaxBlockElements) {
    return absl::DataLossError("bad frame block size");
  }
  // elements / B rounded up, without the wrap of elements + B - 1 near 2^64 (which let a
  // frame of ~2^64 elements pass with no blocks at all).
  const uint64_t want =
      info.elements / info.block_elements + (info.elements % info.block_elements != 0 ? 1 : 0);
  if (count != want) return absl::DataLossError("frame block count does not match its size");
  const uint64_t header = kFrameFixedBytes + uint64_t{4} * count + 8;
  if (header > frame.size()) return absl::DataLossError("frame truncated in its block table");
  if (format::LoadLE64(h + header - 8) != XXH64(h, header - 8, 0)) {
    return absl::DataLossError("frame header checksum mismatch");
  }
  uint64_t pos = header;
  info.blocks.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t size = format::LoadLE32(h + kFrameFixedBytes + 4 * i);
    if (size > frame.size() - pos) return absl::DataLossError("frame truncated in its blocks");
    info.blocks.push_back(frame.subspan(pos, size));
    pos += size;
  }
  if (pos != frame.size()) return absl::DataLossError("trailing bytes after the frame's blocks");
  return info;
}

absl::Status DecodeBuffer(absl::Span<const uint8_t> frame, DType dtype, void* out, size_t n,
                          int threads) {
  BufferDecodeOptions options;
  options.threads = threads;
  return DecodeBuffer(frame, dtype, out, n, options);
}

absl::Status DecodeBuffer(absl::Span<const uint8_t> frame, DType dtype, void* out, size_t n,
                          const BufferDecodeOptions& options) {
  absl::StatusOr<FrameInfo> info = InspectFrame(frame);
  if (!info.ok()) return info.status();
  if (info->dtype != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame holds ", DTypeName(info->dtype), ", expected ", DTypeName(dtype)));
  }
  if (info->elements != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("frame holds ", info->elements, " elements, expected ", n));
  }
  const size_t per = info->block_elements, elem = DTypeBytes(dtype);
  std::vector<absl::Status> status(info->blocks.size());
  BlockDecodeOptions block_options;
  block_options.tables = options.tables;
  RunParallel(options.pool, options.threads, info->blocks.size(), [&](size_t i) {
    const size_t lo = i * per, m = std::min(per, n - lo);
    status[i] = DecodeBlock(info->blocks[i], dtype, static_cast<uint8_t*>(out) + lo * elem, m,
                            block_options);
  });
  for (size_t i = 0; i < status.size(); ++i) {
    if (!status[i].ok()) {
      return absl::Status(status[i].code(), absl::StrCat("block ", i, ": ", status[i].message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace gcomp::codec
