// One block: header, sign + mantissa plane, zero map, code table, 4 exponent streams.
// docs/FORMAT.md specifies every byte.
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/large_buffer.h"
#include "base/reused_per_thread.h"
#include "codec/codec.h"
#include "codec/internal/block_scratch.h"
#include "codec/internal/cpu.h"
#include "codec/internal/format.h"
#include "codec/internal/huffman.h"
#include "codec/internal/join_elements.h"
#include "codec/internal/quantize.h"
#include "format/block_header.h"
#include "format/checksum.h"
#include "format/endian.h"

namespace gcomp::codec {
namespace {

using format::BlockHeader;
using format::LoadLE64;
using format::StoreLE64;
using internal::FloatBits;
using internal::HuffmanCode;

// Scratch that grows without being zero-filled (every pass writes what it later reads), in
// huge pages from half a megabyte on: a short-lived process (the CLI) otherwise spent more on
// zeroing and first-touch page faults than on encoding (base/large_buffer.h).
template <typename T>
class ScratchArray {
 public:
  // At least n elements, their values whatever the last block left there.
  T* Reserve(size_t n) { return reinterpret_cast<T*>(buffer_.Reserve(n * sizeof(T))); }

 private:
  LargeBuffer buffer_;
};

// Per-thread scratch so that encoding many blocks does not allocate (or zero) per block.
struct Scratch {
  ScratchArray<uint8_t> bytes;    // the block being assembled
  ScratchArray<uint8_t> syms;     // exponent symbols of the nonzero elements
  ScratchArray<uint64_t> bitmap;  // 1 = nonzero
};
// Handed on to a later thread when this one exits (base/reused_per_thread.h): callers on
// threads that come and go (gRPC's request threads) would otherwise fault in fresh pages.
Scratch& ThreadScratch() { return ReusedPerThread<Scratch>::Get(); }

uint8_t* PutVarint(uint8_t* p, uint32_t v) {
  while (v >= 128) {
    *p++ = static_cast<uint8_t>(v | 128);
    v >>= 7;
  }
  *p++ = static_cast<uint8_t>(v);
  return p;
}

// Bytes of the gap-varint list of the positions whose bit equals `want`.
size_t PositionListBytes(const uint64_t* bitmap, size_t n, bool want) {
  size_t bytes = 0;
  size_t prev = 0;  // next position a gap of 0 refers to
  for (size_t w = 0; w * 64 < n; ++w) {
    uint64_t bits = want ? bitmap[w] : ~bitmap[w];
    if (w * 64 + 64 > n) bits &= (uint64_t{1} << (n - w * 64)) - 1;
    while (bits) {
      size_t pos = w * 64 + __builtin_ctzll(bits);
      bits &= bits - 1;
      bytes += format::VarintBytes(static_cast<uint32_t>(pos - prev));
      prev = pos + 1;
    }
  }
  return bytes;
}
uint8_t* WritePositionList(const uint64_t* bitmap, size_t n, bool want, uint8_t* p) {
  size_t prev = 0;
  for (size_t w = 0; w * 64 < n; ++w) {
    uint64_t bits = want ? bitmap[w] : ~bitmap[w];
    if (w * 64 + 64 > n) bits &= (uint64_t{1} << (n - w * 64)) - 1;
    while (bits) {
      size_t pos = w * 64 + __builtin_ctzll(bits);
      bits &= bits - 1;
      p = PutVarint(p, static_cast<uint32_t>(pos - prev));
      prev = pos + 1;
    }
  }
  return p;
}

// Rebuilds the nonzero bitmap from a position list; checks every byte of it.
absl::Status ReadPositionList(absl::Span<const uint8_t> list, size_t n, size_t entries, bool want,
                              uint64_t* bitmap) {
  const size_t words = (n + 63) / 64;
  std::fill(bitmap, bitmap + words, want ? 0 : ~uint64_t{0});
  if (!want && n % 64 != 0) bitmap[words - 1] = (uint64_t{1} << (n % 64)) - 1;
  size_t p = 0, next = 0;
  for (size_t e = 0; e < entries; ++e) {
    uint64_t gap = 0;
    for (int shift = 0;; shift += 7) {
      if (p >= list.size() || shift > 28) {
        return absl::DataLossError("zero map: truncated or overlong position varint");
      }
      uint8_t b = list[p++];
      gap |= uint64_t{b & 127u} << shift;
      if (b < 128) break;
    }
    const uint64_t pos = next + gap;
    if (pos >= n) return absl::DataLossError("zero map: position past the element count");
    bitmap[pos / 64] ^= uint64_t{1} << (pos % 64);
    next = pos + 1;
  }
  if (p != list.size()) return absl::DataLossError("zero map: trailing bytes after positions");
  return absl::OkStatus();
}

// Set bits in words[0, n). Without the popcnt instruction (not in baseline x86-64) the
// builtin is a library call per word, about 1.5% of a decode: CountOnes runs the same loop
// inlined into a popcnt-target function where the CPU has it.
inline size_t SumOfPopcounts(const uint64_t* words, size_t n) {
  size_t ones = 0;
  for (size_t w = 0; w < n; ++w) ones += static_cast<size_t>(__builtin_popcountll(words[w]));
  return ones;
}
#if defined(__x86_64__)
__attribute__((target("popcnt"))) size_t CountOnesPopcnt(const uint64_t* words, size_t n) {
  return SumOfPopcounts(words, n);
}
#endif
size_t CountOnes(const uint64_t* words, size_t n) {
#if defined(__x86_64__)
  // Every CPU with AVX2 has popcnt (the vector paths use it too).
  if (internal::MaxVectorLevel() != internal::VectorLevel::kScalar) {
    return CountOnesPopcnt(words, n);
  }
#endif
  return SumOfPopcounts(words, n);
}

// The block checksum (format/checksum.h): the sections hashed by the xxHash library, from
// the seed both codecs take from format/.
uint64_t Checksum(const uint8_t* block, size_t size) {
  return XXH64(block + kBlockHeaderBytes, size - kBlockHeaderBytes,
               format::BlockChecksumSeed(block));
}

// The header's codes as codec.h's types (format.h ties their values).
DType DTypeOf(const BlockHeader& h) { return static_cast<DType>(h.dtype); }
Policy PolicyOf(const BlockHeader& h) {
  return Policy{static_cast<Mode>(h.mode), h.rel_bits, h.abs_log2};
}

// ---------------------------------------------------------------------------------------------
// Encoder.

template <typename U>
absl::StatusOr<absl::Span<const uint8_t>> EncodeTyped(DType dtype, const void* data, size_t n,
                                                      const BlockEncodeOptions& opt) {
  const FloatBits lay = internal::FloatBitsOf(dtype);
  const int M = lay.mant_bits;
  const Policy& pol = opt.policy;

  BlockHeader b = {};
  b.version = format::kBlockVersion;
  b.dtype = static_cast<uint8_t>(dtype);
  b.mode = static_cast<uint8_t>(pol.mode);
  b.rel_bits = static_cast<uint8_t>(pol.rel_bits);
  b.abs_log2 = static_cast<int8_t>(pol.abs_log2);
  b.elements = static_cast<uint32_t>(n);

  // Pass 1: the largest exponent field among finite elements.
  const int emax = internal::MaxFiniteExponent(dtype, data, n);
  b.emax = static_cast<uint8_t>(emax);
  const internal::QuantParams qp = internal::MakeQuantParams(lay, pol, emax);

  Scratch& sc = ThreadScratch();
  const size_t mant_max = (n * (M + 1) + 7) / 8 + 16;
  const size_t words = (n + 63) / 64;
  const size_t cap = kBlockHeaderBytes + mant_max + words * 8 + 16 + 2 + 128 + 8 +
                     internal::MaxStreamBytes(n) + 16;
  uint8_t* blk = sc.bytes.Reserve(cap);
  uint8_t* syms = sc.syms.Reserve(n + 8);
  uint64_t* bitmap = sc.bitmap.Reserve(words + 1);

  // Pass 2: quantize; write the sign + mantissa plane, the symbols and the zero bitmap.
  size_t nnz = 0;
  b.mantissa_bytes = static_cast<uint32_t>(
      internal::SplitElements(dtype, data, n, qp, blk + kBlockHeaderBytes, syms, bitmap, &nnz));
  b.nonzeros = static_cast<uint32_t>(nnz);
  uint8_t* p = blk + kBlockHeaderBytes + b.mantissa_bytes;

  // Zero map: the smallest of none / bitmap / zero positions / nonzero positions.
  const size_t zeros = n - nnz;
  if (zeros == 0) {
    b.zero_map = format::kZeroMapNone;
  } else {
    size_t best = (n + 7) / 8;
    b.zero_map = format::kZeroMapBitmap;
    if (zeros < best) {
      size_t bytes = PositionListBytes(bitmap, n, false);
      if (bytes < best) best = bytes, b.zero_map = format::kZeroMapZeroPositions;
    }
    if (nnz < best) {
      size_t bytes = PositionListBytes(bitmap, n, true);
      if (bytes < best) best = bytes, b.zero_map = format::kZeroMapNonzeroPositions;
    }
    uint8_t* q = p;
    if (b.zero_map == format::kZeroMapBitmap) {
      std::memcpy(q, bitmap, best);
      q += best;
    } else {
      q = WritePositionList(bitmap, n, b.zero_map == format::kZeroMapNonzeroPositions, q);
    }
    b.zero_map_bytes = static_cast<uint32_t>(q - p);
    p = q;
  }

  // Exponent code: the block's own table, or a shared one when that is no larger.
  if (nnz > 0) {
    uint64_t freq[256];
    internal::CountSymbols(syms, nnz, freq);
    HuffmanCode own;
    internal::BuildLengths(freq, lay.alphabet(), &own);
    internal::AssignCodes(&own);
    std::string own_table;
    internal::SerializeTable(own, &own_table);
    const HuffmanCode* code = &own;
    HuffmanCode shared;
    b.table = format::kTableInline;
    if (opt.shared_table != nullptr && opt.shared_table->dtype() == dtype) {
      absl::Status st =
          internal::ParseTable(AsBytes(opt.shared_table->bytes()), lay.alphabet(), &shared);
      if (!st.ok()) return st;
      const uint64_t shared_bits = internal::CodedBits(shared, freq);
      const uint64_t own_bits = internal::CodedBits(own, freq);
      if (shared_bits != UINT64_MAX && shared_bits + 64 <= own_bits + 8 * own_table.size()) {
        code = &shared;
        b.table = format::kTableReference;
      }
    }
    if (b.table == format::kTableInline) {
      std::memcpy(p, own_table.data(), own_table.size());
      b.table_bytes = static_cast<uint32_t>(own_table.size());
    } else {
      StoreLE64(p, opt.shared_table->id());
      b.table_bytes = 8;
    }
    p += b.table_bytes;
    internal::EncodeStreams(syms, nnz, *code, p, b.stream_bytes);
    for (int s = 0; s < format::kNumStreams; ++s) p += b.stream_bytes[s];
  }

  size_t total = static_cast<size_t>(p - blk);
  if (total - kBlockHeaderBytes > n * sizeof(U)) {
    // Incompressible: store the raw elements.
    b = format::StoredHeader(b);
    std::memcpy(blk + kBlockHeaderBytes, data, n * sizeof(U));
    if (pol.mode == Mode::kNearLossless) {
      // Near-lossless zeros decode as +0.0 (docs/FORMAT.md) in stored blocks too.
      constexpr U kMinusZero = static_cast<U>(U{1} << (8 * sizeof(U) - 1));
      uint8_t* stored = blk + kBlockHeaderBytes;
      for (size_t i = 0; i < n; ++i) {
        U v;
        std::memcpy(&v, stored + i * sizeof(U), sizeof(U));
        if (v == kMinusZero) std::memset(stored + i * sizeof(U), 0, sizeof(U));
      }
    }
    total = kBlockHeaderBytes + b.mantissa_bytes;
  }
  format::WriteHeader(b, blk);
  format::StoreBlockChecksum(blk, Checksum(blk, total));
  return absl::Span<const uint8_t>(blk, total);
}

// ---------------------------------------------------------------------------------------------
// Header parsing and validation: everything is checked before any allocation.

// The message of the first header rule a block breaks (format::ParseHeader decides which).
absl::Status HeaderStatus(format::HeaderError error, const format::BlockHeader& h, size_t size) {
  using format::HeaderError;
  switch (error) {
    case HeaderError::kOk:
      return absl::OkStatus();
    case HeaderError::kTooShort:
      return absl::DataLossError(
          absl::StrCat("block of ", size, " bytes is shorter than its 56-byte header"));
    case HeaderError::kBadMagic:
      return absl::DataLossError("not a GComp block (bad magic)");
    case HeaderError::kBadVersion:
      return absl::DataLossError(absl::StrCat("unsupported block format version ", h.version));
    case HeaderError::kBadDType:
      return absl::DataLossError(absl::StrCat("bad dtype code ", h.dtype));
    case HeaderError::kBadMode:
      return absl::DataLossError("bad mode code");
    case HeaderError::kBadRelBits:
    case HeaderError::kBadAbsLog2: {
      const Policy policy{static_cast<Mode>(h.mode), h.rel_bits, h.abs_log2};
      return absl::DataLossError(absl::StrCat("block policy: ", ValidatePolicy(policy).message()));
    }
    case HeaderError::kBadZeroMapKind:
      return absl::DataLossError("bad zero map kind");
    case HeaderError::kBadTableKind:
      return absl::DataLossError("bad table kind");
    case HeaderError::kBadEmax:
      return absl::DataLossError("bad largest exponent");
    case HeaderError::kTooManyElements:
      return absl::DataLossError(absl::StrCat("block claims ", h.elements, " elements (limit 2^26)"));
    case HeaderError::kTooManyNonzeros:
      return absl::DataLossError("more nonzeros than elements");
    case HeaderError::kBadSizeSum:
      return absl::DataLossError(absl::StrCat("section sizes sum to ", h.section_bytes,
                                              " bytes but the block has ", size));
    case HeaderError::kBadStoredSections:
      return absl::DataLossError("stored block with inconsistent sections");
    case HeaderError::kTableVsNonzeros:
      return absl::DataLossError("table kind does not match the nonzero count");
    case HeaderError::kBadEmptySections:
      return absl::DataLossError("block without nonzeros has nonempty sections");
    case HeaderError::kBadInlineTableSize:
      return absl::DataLossError("bad inline table size");
    case HeaderError::kBadReferenceSize:
      return absl::DataLossError("bad table reference size");
    case HeaderError::kZerosWithoutMap:
      return absl::DataLossError("zero map kind 'none' but the block has zeros");
    case HeaderError::kBadBitmapSize:
      return absl::DataLossError("bad bitmap size");
    case HeaderError::kBadPositionListSize:
      return absl::DataLossError("bad position list size");
    case HeaderError::kStreamTooLarge:
      return absl::DataLossError("exponent stream larger than its symbols allow");
    case HeaderError::kBadPlaneSize:
      return absl::DataLossError("bad sign/mantissa plane size");
  }
  return absl::DataLossError("bad block header");
}

// A block whose header passed every check: the header, and the id of the shared code table
// it refers to (0 unless its table kind is a reference).
struct ParsedBlock {
  BlockHeader header;
  uint64_t table_id = 0;
};

absl::StatusOr<ParsedBlock> ParseBlock(absl::Span<const uint8_t> blk,
                                       bool verify_checksum = true) {
  ParsedBlock b;
  const BlockHeader& h = b.header;
  if (absl::Status st =
          HeaderStatus(format::ParseHeader(blk.data(), blk.size(), &b.header), h, blk.size());
      !st.ok()) {
    return st;
  }
  if (verify_checksum &&
      format::LoadBlockChecksum(blk.data()) != Checksum(blk.data(), blk.size())) {
    return absl::DataLossError("block checksum mismatch");
  }
  if (h.table == format::kTableReference) {
    b.table_id = LoadLE64(blk.data() + kBlockHeaderBytes + h.mantissa_bytes + h.zero_map_bytes);
  }
  return b;
}

// The public view of a parsed block (codec.h's BlockInfo, which callers outside codec/ read).
BlockInfo InfoOf(const ParsedBlock& parsed, size_t size) {
  const BlockHeader& h = parsed.header;
  BlockInfo b;
  b.dtype = DTypeOf(h);
  b.policy = PolicyOf(h);
  b.zero_map = static_cast<ZeroMapKind>(h.zero_map);
  b.table = static_cast<TableKind>(h.table);
  b.table_id = parsed.table_id;
  b.emax = h.emax;
  b.elements = h.elements;
  b.nonzeros = h.nonzeros;
  b.mantissa_bytes = h.mantissa_bytes;
  b.zero_map_bytes = h.zero_map_bytes;
  b.table_bytes = h.table_bytes;
  for (int s = 0; s < format::kNumStreams; ++s) b.stream_bytes[s] = h.stream_bytes[s];
  b.exponent_bytes = h.exponent_bytes;
  b.total_bytes = size;
  return b;
}

// ---------------------------------------------------------------------------------------------
// Decoder.

template <typename U>
absl::Status DecodeTyped(const ParsedBlock& parsed, absl::Span<const uint8_t> blk,
                         const BlockDecodeOptions& opt, void* out) {
  const BlockHeader& b = parsed.header;
  const DType dtype = DTypeOf(b);
  const FloatBits lay = internal::FloatBitsOf(dtype);
  const size_t n = b.elements, nnz = b.nonzeros;
  const uint8_t* p = blk.data() + kBlockHeaderBytes;
  if (b.table == format::kTableStored) {
    std::memcpy(out, p, n * sizeof(U));
    return absl::OkStatus();
  }
  if (nnz == 0) {
    std::memset(out, 0, n * sizeof(U));
    return absl::OkStatus();
  }
  const absl::Span<const uint8_t> mant(p, b.mantissa_bytes);
  p += b.mantissa_bytes;
  const absl::Span<const uint8_t> zmap(p, b.zero_map_bytes);
  p += b.zero_map_bytes;
  const absl::Span<const uint8_t> table(p, b.table_bytes);
  p += b.table_bytes;
  absl::Span<const uint8_t> streams[format::kNumStreams];
  for (int s = 0; s < format::kNumStreams; ++s) {
    streams[s] = absl::Span<const uint8_t>(p, b.stream_bytes[s]);
    p += b.stream_bytes[s];
  }

  HuffmanCode code;
  if (b.table == format::kTableInline) {
    if (absl::Status st = internal::ParseTable(table, lay.alphabet(), &code); !st.ok()) return st;
  } else {
    if (opt.tables == nullptr) {
      return absl::NotFoundError(absl::StrCat("block refers to code table ", parsed.table_id,
                                              " but no tables are known"));
    }
    absl::StatusOr<CodeTable> t = opt.tables->Find(parsed.table_id);
    if (!t.ok()) return t.status();
    if (t->dtype() != dtype) return absl::DataLossError("referenced table has another dtype");
    if (absl::Status st = internal::ParseTable(AsBytes(t->bytes()), lay.alphabet(), &code);
        !st.ok()) {
      return st;
    }
  }
  uint16_t dec[internal::kDecodeTableSize];
  internal::BuildDecodeTable(code, dec);

  Scratch& sc = ThreadScratch();
  // Room for every element, not just this block's nonzeros: blocks of a frame differ in
  // nonzero count, and growing the scratch for each larger one faulted in fresh pages.
  // (n is the caller's own output size, checked against the header.)
  uint8_t* syms = sc.syms.Reserve(n + 8);
  if (absl::Status st = internal::DecodeStreams(streams, dec, nnz, syms); !st.ok()) return st;
  std::memset(syms + nnz, 0, 8);

  const internal::QuantParams qp = internal::MakeQuantParams(lay, PolicyOf(b), b.emax);
  if (b.zero_map == format::kZeroMapNone) {
    return internal::JoinElements(dtype, syms, nnz, mant, qp, nullptr, n, out);
  }

  // Zeros present: the nonzero bitmap, from the map as sent or from its position list.
  const size_t words = (n + 63) / 64;
  uint64_t* bm = sc.bitmap.Reserve(words + 1);
  if (b.zero_map == format::kZeroMapBitmap) {
    bm[words - 1] = 0;
    std::memcpy(bm, zmap.data(), zmap.size());
    if (n % 64 != 0 && (bm[words - 1] >> (n % 64)) != 0) {
      return absl::DataLossError("zero map: padding bits set");
    }
  } else {
    const bool nonzero_list = b.zero_map == format::kZeroMapNonzeroPositions;
    absl::Status st = ReadPositionList(zmap, n, nonzero_list ? nnz : n - nnz, nonzero_list, bm);
    if (!st.ok()) return st;
  }
  if (CountOnes(bm, words) != nnz) {
    return absl::DataLossError("zero map does not match the nonzero count");
  }
  return internal::JoinElements(dtype, syms, nnz, mant, qp, bm, n, out);
}

}  // namespace

size_t MaxBlockEncodedBytes(size_t n, DType dtype) {
  return kBlockHeaderBytes + n * DTypeBytes(dtype);
}

absl::Status EncodeBlock(DType dtype, const void* data, size_t n, const Policy& policy,
                         std::string* out) {
  BlockEncodeOptions options;
  options.policy = policy;
  return EncodeBlock(dtype, data, n, options, out);
}

absl::Status EncodeBlock(DType dtype, const void* data, size_t n, const BlockEncodeOptions& options,
                         std::string* out) {
  absl::StatusOr<absl::Span<const uint8_t>> block =
      internal::EncodeBlockToScratch(dtype, data, n, options);
  if (!block.ok()) return block.status();
  out->append(reinterpret_cast<const char*>(block->data()), block->size());
  return absl::OkStatus();
}

namespace {

// Lossless input whose finite nonzero elements all end in zero mantissa bits (float32 holding
// bfloat16 or float16 values, as the gradients of a bf16 autocast do): near-lossless with R
// the bits in use and an A that zeroes nothing writes every element back bit for bit, in
// fewer bits (docs/FORMAT.md, "Lossless input with unused mantissa bits"). Sets `*policy`
// to it when it saves a bit. The pass stops at the first 256 elements that use every
// mantissa bit, which on ordinary data are the first.
// What ExactWithFewerBits needs of a block, or possible = false as soon as it is clear that
// nothing can be saved.
template <typename U>
struct TrimScan {
  bool possible = true;
  U used = 0;   // OR of the mantissas of elements with fields 1..all_ones-2
  U min_e = 0;  // the least of those fields (all_ones if none)
  U emax = 0;   // the largest finite field
  bool subnormal = false;
};

// One pass over 32 bytes of lanes at a time (GCC/Clang vector extensions), stopping at the
// first 256 elements that use the last mantissa bit or hold -0.0.
template <typename U, int kMantBits, int kExpBits>
__attribute__((always_inline)) inline TrimScan<U> ScanForTrim(const U* x, size_t n) {
  typedef U V __attribute__((vector_size(32)));
  constexpr size_t kLanes = 32 / sizeof(U);
  constexpr U kSign = static_cast<U>(U{1} << (8 * sizeof(U) - 1));
  constexpr U kMant = static_cast<U>((U{1} << kMantBits) - 1);
  constexpr U kAllOnes = static_cast<U>((1u << kExpBits) - 1);
  TrimScan<U> r;
  r.min_e = kAllOnes;
  for (size_t begin = 0; begin < n; begin += 256) {
    const size_t end = std::min(n, begin + 256);
    V v_used = {}, v_min = {}, v_max = {}, v_minus_zero = {}, v_sub = {};
    v_min += kAllOnes;
    size_t i = begin;
    for (; i + kLanes <= end; i += kLanes) {
      V u;
      std::memcpy(&u, x + i, sizeof(u));
      const V e = (u & static_cast<U>(~kSign)) >> kMantBits;
      const V m = u & kMant;
      const V normal = reinterpret_cast<V>(e - 1 < static_cast<U>(kAllOnes - 2));
      v_used |= m & normal;
      const V lower = reinterpret_cast<V>(e < v_min) & normal;
      v_min = (e & lower) | (v_min & ~lower);
      const V higher = reinterpret_cast<V>(e > v_max) & reinterpret_cast<V>(e < kAllOnes);
      v_max = (e & higher) | (v_max & ~higher);
      v_minus_zero |= reinterpret_cast<V>(u == kSign);
      v_sub |= reinterpret_cast<V>(e == 0) & reinterpret_cast<V>(m != 0);
    }
    U used = 0, min_e = kAllOnes, emax = 0, minus_zero = 0, sub = 0;
    for (size_t l = 0; l < kLanes; ++l) {
      used |= v_used[l];
      min_e = std::min<U>(min_e, v_min[l]);
      emax = std::max<U>(emax, v_max[l]);
      minus_zero |= v_minus_zero[l];
      sub |= v_sub[l];
    }
    for (; i < end; ++i) {
      const U u = x[i];
      const U e = static_cast<U>((u & ~kSign) >> kMantBits);
      const U m = static_cast<U>(u & kMant);
      if (static_cast<U>(e - 1) < static_cast<U>(kAllOnes - 2)) {
        used |= m;
        min_e = std::min(min_e, e);
      }
      if (e < kAllOnes) emax = std::max(emax, e);
      minus_zero |= u == kSign;
      sub |= e == 0 && m != 0;
    }
    r.used |= used;
    // -0.0 decodes as +0.0 in near-lossless mode; a last mantissa bit in use saves nothing.
    if (minus_zero != 0 || (r.used & 1) != 0) {
      r.possible = false;
      return r;
    }
    r.min_e = std::min(r.min_e, min_e);
    r.emax = std::max(r.emax, emax);
    r.subnormal |= sub != 0;
  }
  return r;
}

template <typename U, int kMantBits, int kExpBits>
__attribute__((target("avx2"))) TrimScan<U> ScanForTrimAvx2(const U* x, size_t n) {
  return ScanForTrim<U, kMantBits, kExpBits>(x, n);
}

template <typename U, int kMantBits, int kExpBits>
TrimScan<U> ScanForTrimAt(const void* data, size_t n) {
  const U* x = static_cast<const U*>(data);
#if defined(__x86_64__)
  if (internal::MaxVectorLevel() >= internal::VectorLevel::kAvx2) {
    return ScanForTrimAvx2<U, kMantBits, kExpBits>(x, n);
  }
#endif
  return ScanForTrim<U, kMantBits, kExpBits>(x, n);
}

template <typename U>
bool PolicyForTrim(const FloatBits& lay, const TrimScan<U>& scan, Policy* policy) {
  if (!scan.possible) return false;
  const int W = lay.mant_bits;
  int trailing = 0;
  while (trailing < W && ((scan.used >> trailing) & 1) == 0) ++trailing;
  const int rel_bits = W - trailing;
  // Every field 1..all_ones-2 must keep rel_bits bits, -A - 1 - (emax - e) >= R (docs/
  // FORMAT.md, the mantissa widths), so A <= -1 - R - (emax - least field) and A >= -128;
  // that A zeroes no field in use. The largest such A leaves fields below emax + A >= 1 to
  // be zeros, which takes the encoder's fast near-lossless path; subnormals need
  // emax + A <= 0 instead, which the slower general path handles.
  const int top = scan.emax, least = scan.min_e;
  // Only fields 1..all_ones-2 are trimmed: without one (all zeros, say) nothing is saved.
  if (least >= lay.all_ones()) return false;
  int abs_log2 = -1 - rel_bits - (top - least);
  if (abs_log2 < -128) return false;
  if (scan.subnormal) {
    abs_log2 = std::min(abs_log2, -top);
    if (abs_log2 < -128) return false;
  }
  policy->mode = Mode::kNearLossless;
  policy->rel_bits = rel_bits;
  policy->abs_log2 = abs_log2;
  return true;
}

bool ExactWithFewerBits(DType dtype, const void* data, size_t n, Policy* policy) {
  const FloatBits lay = internal::FloatBitsOf(dtype);
  switch (dtype) {
    case DType::kF32:
      return PolicyForTrim(lay, ScanForTrimAt<uint32_t, 23, 8>(data, n), policy);
    case DType::kBF16:
      return PolicyForTrim(lay, ScanForTrimAt<uint16_t, 7, 8>(data, n), policy);
    case DType::kF16:
      return PolicyForTrim(lay, ScanForTrimAt<uint16_t, 10, 5>(data, n), policy);
  }
  return false;
}

}  // namespace

namespace internal {

absl::StatusOr<absl::Span<const uint8_t>> EncodeBlockToScratch(DType dtype, const void* data,
                                                               size_t n,
                                                               const BlockEncodeOptions& options) {
  if (absl::Status st = ValidatePolicy(options.policy); !st.ok()) return st;
  if (!internal::IsValidDType(static_cast<uint8_t>(dtype))) {
    return absl::InvalidArgumentError("bad dtype");
  }
  if (n > kMaxBlockElements) {
    return absl::InvalidArgumentError(absl::StrCat("a block holds at most 2^26 elements, got ", n));
  }
  if (n > 0 && data == nullptr) return absl::InvalidArgumentError("null data");
  if (options.policy.mode == Mode::kLossless && options.trim_unused_mantissa_bits) {
    BlockEncodeOptions trimmed = options;
    const bool fewer = ExactWithFewerBits(dtype, data, n, &trimmed.policy);
    if (fewer) {
      if (dtype == DType::kF32) return EncodeTyped<uint32_t>(dtype, data, n, trimmed);
      return EncodeTyped<uint16_t>(dtype, data, n, trimmed);
    }
  }
  if (dtype == DType::kF32) return EncodeTyped<uint32_t>(dtype, data, n, options);
  return EncodeTyped<uint16_t>(dtype, data, n, options);
}

}  // namespace internal

absl::StatusOr<BlockInfo> InspectBlock(absl::Span<const uint8_t> block) {
  absl::StatusOr<ParsedBlock> parsed = ParseBlock(block);
  if (!parsed.ok()) return parsed.status();
  return InfoOf(*parsed, block.size());
}

absl::StatusOr<BlockInfo> InspectBlockSkippingChecksum(absl::Span<const uint8_t> block) {
  absl::StatusOr<ParsedBlock> parsed = ParseBlock(block, /*verify_checksum=*/false);
  if (!parsed.ok()) return parsed.status();
  return InfoOf(*parsed, block.size());
}

absl::Status DecodeBlock(absl::Span<const uint8_t> block, DType expected_dtype, void* out,
                         size_t n) {
  return DecodeBlock(block, expected_dtype, out, n, BlockDecodeOptions());
}

absl::Status DecodeBlock(absl::Span<const uint8_t> block, DType expected_dtype, void* out, size_t n,
                         const BlockDecodeOptions& options) {
  absl::StatusOr<ParsedBlock> parsed = ParseBlock(block, options.verify_checksum);
  if (!parsed.ok()) return parsed.status();
  const BlockHeader& h = parsed->header;
  if (DTypeOf(h) != expected_dtype) {
    return absl::InvalidArgumentError(absl::StrCat("block holds ", DTypeName(DTypeOf(h)),
                                                   ", expected ", DTypeName(expected_dtype)));
  }
  if (h.elements != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("block holds ", h.elements, " elements, expected ", n));
  }
  if (n == 0) return absl::OkStatus();
  if (out == nullptr) return absl::InvalidArgumentError("null output");
  if (expected_dtype == DType::kF32) return DecodeTyped<uint32_t>(*parsed, block, options, out);
  return DecodeTyped<uint16_t>(*parsed, block, options, out);
}

}  // namespace gcomp::codec
