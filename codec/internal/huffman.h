// Length-limited canonical Huffman codes for exponent symbols and their 4-stream coding.
// Internal to codec/; the serialized table and the bit order are in docs/FORMAT.md. The
// code and its tables are built in huffman.cc, which also picks the scalar, AVX2 or
// AVX-512 version of each stream pass (huffman_scalar.cc, huffman_avx2.cc, huffman_avx512.cc).
#ifndef GCOMP_CODEC_INTERNAL_HUFFMAN_H_
#define GCOMP_CODEC_INTERNAL_HUFFMAN_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "codec/internal/cpu.h"
#include "format/block_format.h"

namespace gcomp::codec::internal {

using format::kDecodeTableSize;
using format::kMaxCodeLen;
using format::kNumStreams;
using format::StreamCount;

// A prefix code over an alphabet of up to 256 symbols. len[s] == 0 means "absent", except in
// a single-symbol code, where the one symbol takes 0 bits.
struct HuffmanCode {
  int alphabet = 0;
  int num_symbols = 0;     // symbols present
  int single_symbol = -1;  // the symbol of a single-symbol code
  uint8_t len[256] = {};
  uint16_t code[256] = {};  // canonical codes, bit-reversed for LSB-first emission
};

// Builds code lengths (<= kMaxCodeLen) from frequencies; deterministic.
void BuildLengths(const uint64_t* freq, int alphabet, HuffmanCode* code);
// Fills code->code from code->len (canonical order: by length, then symbol).
void AssignCodes(HuffmanCode* code);
// Total bits to code the frequencies with this code; UINT64_MAX if a used symbol is absent.
uint64_t CodedBits(const HuffmanCode& code, const uint64_t* freq);

// Appends the serialized table (min symbol, count - 1, 4-bit lengths).
void SerializeTable(const HuffmanCode& code, std::string* out);
// Parses and validates (complete code, lengths <= kMaxCodeLen, in-alphabet) a table.
absl::Status ParseTable(absl::Span<const uint8_t> bytes, int alphabet, HuffmanCode* code);

// Entry: symbol | length << 8.
void BuildDecodeTable(const HuffmanCode& code, uint16_t* table /*[kDecodeTableSize]*/);

// freq[s] = occurrences of s in syms[0, n) (overwrites all 256 entries).
void CountSymbols(const uint8_t* syms, size_t n, uint64_t freq[256]);
// CountSymbols limited to a vector level (clamped to what this CPU has), and the same
// without any vector path (tests compare them).
void CountSymbolsAt(VectorLevel level, const uint8_t* syms, size_t n, uint64_t freq[256]);
void CountSymbolsScalar(const uint8_t* syms, size_t n, uint64_t freq[256]);

// Where the vector encoders look codes up: every symbol of the code lies in one of `count`
// windows of `width` symbols, [base[k], base[k] + width), which do not overlap and ascend.
// A block whose finite exponents span a few binades and that holds a NaN or an Inf (symbol
// 255, or 31 for f16) needs two windows where one run from the smallest would need 100+.
struct SymbolWindows {
  static constexpr int kMax = 4;
  int base[kMax] = {};
  int count = 0;  // 0: the code has no symbol, or needs more than the windows allowed
};
// The fewest windows of `width` (taken from the smallest symbol up, which is optimal) that
// cover the code's symbols, if there are at most max_windows (<= SymbolWindows::kMax).
SymbolWindows CoverSymbols(const HuffmanCode& code, int width, int max_windows);

// Codes syms[0, n) as 4 streams, written back to back at `out` (which needs
// MaxStreamBytes(n) + 8 writable bytes). Returns each stream's byte size.
void EncodeStreams(const uint8_t* syms, size_t n, const HuffmanCode& code, uint8_t* out,
                   uint32_t sizes[kNumStreams]);
// EncodeStreams limited to a vector level (clamped to what this CPU has), and the same
// without any vector path (tests compare them).
void EncodeStreamsAt(VectorLevel level, const uint8_t* syms, size_t n, const HuffmanCode& code,
                     uint8_t* out, uint32_t sizes[kNumStreams]);
void EncodeStreamsScalar(const uint8_t* syms, size_t n, const HuffmanCode& code, uint8_t* out,
                         uint32_t sizes[kNumStreams]);
inline size_t MaxStreamBytes(size_t n) { return (n * kMaxCodeLen + 7) / 8 + kNumStreams; }

// Decodes n symbols from the 4 streams (spans of the block) into syms[0, n). DataLoss if a
// stream does not end exactly at its last byte. One portable version serves every level.
absl::Status DecodeStreams(const absl::Span<const uint8_t> streams[kNumStreams],
                           const uint16_t* table, size_t n, uint8_t* syms);

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_HUFFMAN_H_
