// GComp gradient codec (CPU): exponent Huffman coding, multi-level mantissa quantization and
// zero pruning, after "Near-Lossless Gradient Compression for Data-Parallel Distributed DNN
// Training" (SoCC 2024). The byte-level format is specified in docs/FORMAT.md.
//
// Thread safety: every function is thread-safe; a CodeTableStore may be shared by threads.
// Decoding never trusts its input: any malformed, truncated or corrupted block yields an
// error status (InvalidArgument, DataLoss or NotFound), never a crash or an allocation beyond
// the header's checked bounds.
#ifndef GCOMP_CODEC_CODEC_H_
#define GCOMP_CODEC_CODEC_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "format/block_format.h"
#include "absl/types/span.h"

namespace gcomp {
class ThreadPool;
}  // namespace gcomp

namespace gcomp::codec {

// ---------------------------------------------------------------------------------------------
// Element types.

enum class DType : uint8_t { kF32 = 1, kBF16 = 2, kF16 = 3 };

// Bytes per element: 4, 2, 2.
size_t DTypeBytes(DType dtype);
// "f32", "bf16", "f16".
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Exact widening of n elements to float32 (bit-exact for every input, NaN payloads included).
void ToF32(DType dtype, const void* in, size_t n, float* out);
// Round-to-nearest-even narrowing of n float32 values (a copy for kF32). NaN stays NaN.
void FromF32(DType dtype, const float* in, size_t n, void* out);

// ---------------------------------------------------------------------------------------------
// Quantization policy.

enum class Mode : uint8_t { kLossless = 0, kNearLossless = 1 };

// "lossless" | "near-lossless".
absl::StatusOr<Mode> ParseMode(absl::string_view name);
absl::string_view ModeName(Mode mode);

// How much precision a block keeps.
//
// kLossless restores every input bit pattern exactly (NaN payloads, -0.0, subnormals, Inf).
// kNearLossless guarantees, for every finite element x of a block whose largest finite
// magnitude is M:  |decoded - x| <= max(2^-(rel_bits+1) * |x|, 2^abs_log2 * M)   (ErrorBound)
// and also: zeros decode as +0.0, the sign of a nonzero decoded value never flips, non-finite
// values come back bit-exactly, and a finite value never becomes Inf. Elements below the floor
// may decode as zero.
struct Policy {
  Mode mode = Mode::kNearLossless;
  // R: mantissa bits kept by the elements near the block's largest exponent, in [0, 23]
  // (capped at the dtype's mantissa width: 7 for bf16, 10 for f16).
  int rel_bits = 7;
  // A: log2 of the absolute error floor relative to the block's largest magnitude, in
  // [-128, 0]. Elements more than -A binades below the largest become zero.
  int abs_log2 = -16;
};

absl::Status ValidatePolicy(const Policy& policy);

// The first of rel_bits and abs_log2 outside its range: the field's name and the rule it
// breaks ("must be in [0, 23], got 24"); ValidatePolicy reports it as "<field> <rule>".
// One definition of the ranges, for ValidatePolicy and the cluster config's codec fields.
struct PolicyRangeError {
  std::string field;
  std::string rule;
};
std::optional<PolicyRangeError> CheckPolicyRanges(const Policy& policy);

// The guaranteed error bound for a finite element x in a block whose largest finite magnitude
// is block_max_abs (0 for kLossless).
double ErrorBound(const Policy& policy, double x, double block_max_abs);

// ---------------------------------------------------------------------------------------------
// Shared code tables: a block may name a table the receiver already holds instead of carrying
// it (8 bytes instead of up to 130).

// An exponent code table (opaque; its serialized form is specified in docs/FORMAT.md).
class CodeTable {
 public:
  // Builds a table from a sample of data encoded under `policy`. Exponents within 4 binades of
  // the sample's range get a code; a block using any other falls back to its own table.
  static absl::StatusOr<CodeTable> Build(DType dtype, const void* data, size_t n,
                                         const Policy& policy);
  // Parses and validates serialized table bytes.
  static absl::StatusOr<CodeTable> Parse(DType dtype, absl::Span<const uint8_t> bytes);

  DType dtype() const { return dtype_; }
  // XXH64 of the serialized bytes: the id blocks refer to.
  uint64_t id() const { return id_; }
  const std::string& bytes() const { return bytes_; }

 private:
  CodeTable() = default;
  DType dtype_ = DType::kF32;
  uint64_t id_ = 0;
  std::string bytes_;
};

// Tables known to both sides, by id. Thread-safe.
class CodeTableStore {
 public:
  // Adds (or keeps) the table; returns its id.
  uint64_t Add(const CodeTable& table);
  // NotFound if no table has this id.
  absl::StatusOr<CodeTable> Find(uint64_t id) const;
  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, CodeTable> tables_ ABSL_GUARDED_BY(mu_);
};

// ---------------------------------------------------------------------------------------------
// Blocks: one self-contained, checksummed unit of at most kMaxBlockElements elements.

inline constexpr size_t kMaxBlockElements = format::kMaxElements;  // 2^26
inline constexpr size_t kBlockHeaderBytes = format::kHeaderBytes;   // 56

struct BlockEncodeOptions {
  Policy policy;
  // If set (borrowed, must outlive the call), the block refers to this table by id when that
  // is no larger than carrying its own table. The receiver must hold the same table.
  const CodeTable* shared_table = nullptr;
  // Lossless only: when every finite nonzero element leaves its low mantissa bits zero
  // (float32 holding bfloat16 or float16 values), write the block in near-lossless mode with
  // R = the bits in use and an A that zeroes nothing, which decodes to the same bits
  // (docs/FORMAT.md). Off:
  // always lossless mode, as the GPU encoder writes.
  bool trim_unused_mantissa_bits = true;
};

struct BlockDecodeOptions {
  // Tables a block may refer to (borrowed, must outlive the call). A block that refers to a
  // table not found here fails with NotFound.
  const CodeTableStore* tables = nullptr;
  // Whether to recompute the block's checksum (a pass over every byte, about 6% of a
  // decode). Only a caller that has just verified a checksum of its own over exactly these
  // bytes (the service's wire checksum) turns it off: the decoder never depends on it for
  // safety (a forged block can carry a valid checksum), only for catching damage.
  bool verify_checksum = true;
};

// Upper bound on the bytes EncodeBlock appends for n elements (a header plus the raw data:
// a block that would not compress is stored raw).
size_t MaxBlockEncodedBytes(size_t n, DType dtype);

// Appends one block holding n elements (n <= kMaxBlockElements) to *out.
// Same input, dtype and options => same bytes.
absl::Status EncodeBlock(DType dtype, const void* data, size_t n, const Policy& policy,
                         std::string* out);
absl::Status EncodeBlock(DType dtype, const void* data, size_t n,
                         const BlockEncodeOptions& options, std::string* out);

// Decodes one whole block (exactly block.size() bytes) into out[0, n). n must equal the
// block's element count and the dtype must match.
absl::Status DecodeBlock(absl::Span<const uint8_t> block, DType expected_dtype, void* out,
                         size_t n);
absl::Status DecodeBlock(absl::Span<const uint8_t> block, DType expected_dtype, void* out,
                         size_t n, const BlockDecodeOptions& options);

enum class ZeroMapKind : uint8_t {
  kNone = 0,              // no zeros
  kBitmap = 1,            // 1 bit per element
  kZeroPositions = 2,     // gap varints of the zero positions
  kNonzeroPositions = 3,  // gap varints of the nonzero positions
};
enum class TableKind : uint8_t {
  kNone = 0,       // no nonzero elements
  kInline = 1,     // the block carries its code table
  kReference = 2,  // the block names a shared table by id
  kStored = 3,     // raw element bytes (incompressible input)
};

// Header fields and section sizes of one block; the checksum is verified.
struct BlockInfo {
  DType dtype = DType::kF32;
  Policy policy;
  int emax = 0;  // largest exponent field among finite input elements
  uint32_t elements = 0;
  uint32_t nonzeros = 0;
  ZeroMapKind zero_map = ZeroMapKind::kNone;
  TableKind table = TableKind::kNone;
  uint64_t table_id = 0;  // for kReference
  size_t header_bytes = kBlockHeaderBytes;
  size_t mantissa_bytes = 0;  // sign + mantissa plane (or raw bytes for kStored)
  size_t zero_map_bytes = 0;
  size_t table_bytes = 0;
  size_t exponent_bytes = 0;  // all four streams
  uint32_t stream_bytes[4] = {0, 0, 0, 0};
  size_t total_bytes = 0;
};

absl::StatusOr<BlockInfo> InspectBlock(absl::Span<const uint8_t> block);
// InspectBlock without recomputing the checksum (a pass over every byte), for a caller that
// decodes the block next (DecodeBlock verifies it) or wrote it itself. Every other check is
// made.
absl::StatusOr<BlockInfo> InspectBlockSkippingChecksum(absl::Span<const uint8_t> block);

// ---------------------------------------------------------------------------------------------
// Buffers: a frame of blocks of at most block_bytes of input each, encoded/decoded on a thread
// pool.

struct BufferOptions {
  Policy policy;
  // Most input bytes per block (rounded down to whole elements; at least one element). The
  // buffer is cut into equal blocks no larger than this, an even number of them when there
  // is more than one (so that 2 threads get equal shares); docs/FORMAT.md has the rule.
  size_t block_bytes = size_t{1} << 20;
  // Worker threads when `pool` is null; 1 runs on the calling thread.
  int threads = 1;
  // Borrowed; if set it is used instead of `threads` and must outlive the call.
  ThreadPool* pool = nullptr;
  // Optional shared table for every block (see BlockEncodeOptions).
  const CodeTable* shared_table = nullptr;
};

struct BufferDecodeOptions {
  int threads = 1;
  ThreadPool* pool = nullptr;                 // borrowed, as in BufferOptions
  const CodeTableStore* tables = nullptr;     // borrowed, as in BlockDecodeOptions
};

// Upper bound on the bytes EncodeBuffer appends for n elements with the given block size.
size_t MaxEncodedBytes(size_t n, DType dtype, size_t block_bytes);
// The same for the default block size.
size_t MaxEncodedBytes(size_t n, DType dtype);

// Appends a frame holding n elements to *out. The bytes do not depend on the thread count.
// Blocks are written straight into *out, which is first reserved for the worst case
// (MaxEncodedBytes); on error *out is left as it was.
absl::Status EncodeBuffer(DType dtype, const void* data, size_t n, const BufferOptions& options,
                          std::string* out);

// Where EncodeBufferTo puts a frame's bytes, for callers that write it somewhere other than
// a string (a file): Write(offset, bytes), offsets counted from the frame's first byte.
// Blocks come in order, each as soon as it and those before it are encoded, one after
// another from offset FrameHeaderBytes(); the header comes last, at offset 0, once the
// block sizes are known. Calls never overlap. An error stops the encoding and is returned.
using FrameSink =
    std::function<absl::Status(uint64_t offset, absl::Span<const uint8_t> bytes)>;

// How a frame cuts n elements: `blocks` blocks of `block_elements` each, the last one
// possibly shorter (docs/FORMAT.md). Block i holds elements [i * block_elements, ...).
struct FrameLayout {
  size_t block_elements = 1;
  size_t blocks = 0;
};
FrameLayout FrameLayoutOf(size_t n, DType dtype, size_t block_bytes);

// The size of the header (and block size table) of a frame of n elements.
size_t FrameHeaderBytes(size_t n, DType dtype, size_t block_bytes);

// EncodeBuffer, handing the frame to `sink` instead of a string: the same bytes, without
// gathering them in memory first. On error the sink may have received part of the frame.
absl::Status EncodeBufferTo(DType dtype, const void* data, size_t n, const BufferOptions& options,
                            const FrameSink& sink);

// Decodes a whole frame into out[0, n); n must equal the frame's element count.
absl::Status DecodeBuffer(absl::Span<const uint8_t> frame, DType dtype, void* out, size_t n,
                          int threads);
absl::Status DecodeBuffer(absl::Span<const uint8_t> frame, DType dtype, void* out, size_t n,
                          const BufferDecodeOptions& options);

// Frame header fields and the blocks' spans (pointing into `frame`).
struct FrameInfo {
  DType dtype = DType::kF32;
  uint64_t elements = 0;
  uint32_t block_elements = 0;
  std::vector<absl::Span<const uint8_t>> blocks;
};
absl::StatusOr<FrameInfo> InspectFrame(absl::Span<const uint8_t> frame);

// Views a byte string as the span the decoders take.
inline absl::Span<const uint8_t> AsBytes(absl::string_view s) {
  return absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

}  // namespace gcomp::codec

#endif  // GCOMP_CODEC_CODEC_H_
