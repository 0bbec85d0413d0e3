// Canonical, length-limited Huffman codes for the exponent symbols: how the encoder builds a
// code from symbol counts and writes its serialized table, and how a decoder reads the table
// (docs/FORMAT.md, section 3). One definition for codec/ and the GPU kernels, so both emit
// the same bytes.
#ifndef GCOMP_FORMAT_HUFFMAN_CODE_H_
#define GCOMP_FORMAT_HUFFMAN_CODE_H_

#include <cstddef>
#include <cstdint>

#include "format/block_format.h"
#include "format/portable.h"

namespace gcomp::format {

// Scratch of BuildLengths (about 8 KB: a stack object on the CPU, shared memory on the GPU).
struct HuffmanWork {
  uint64_t leaf_freq[256];
  uint16_t leaf_sym[256];
  uint64_t weight[512];
  int16_t parent[512];
  uint8_t depth[512];
};

// Sorts leaves [0, m) by (frequency, symbol): insertion sort, as the keys are unique and m is
// at most 256.
GCOMP_HD void SortLeaves(HuffmanWork& w, int m) {
  for (int i = 1; i < m; ++i) {
    const uint64_t f = w.leaf_freq[i];
    const uint16_t s = w.leaf_sym[i];
    int j = i - 1;
    while (j >= 0 && (w.leaf_freq[j] > f || (w.leaf_freq[j] == f && w.leaf_sym[j] > s))) {
      w.leaf_freq[j + 1] = w.leaf_freq[j];
      w.leaf_sym[j + 1] = w.leaf_sym[j];
      --j;
    }
    w.leaf_freq[j + 1] = f;
    w.leaf_sym[j + 1] = s;
  }
}

// Code lengths (at most kMaxCodeLen) for freq[0, alphabet) into len[0, 256): Huffman by the
// two-queue method over leaves sorted by (frequency, symbol), frequencies halved (rounding
// up) until the longest code fits, so the result depends only on the frequencies. Returns
// the number of symbols present; *single gets the symbol of a one-symbol code, else -1.
template <typename Freq>
GCOMP_HD int BuildLengths(const Freq* freq, int alphabet, HuffmanWork& w, uint8_t* len,
                          int* single) {
  int m = 0;
  for (int s = 0; s < 256; ++s) len[s] = 0;
  for (int s = 0; s < alphabet; ++s) {
    if (freq[s] > 0) {
      w.leaf_freq[m] = freq[s];
      w.leaf_sym[m] = static_cast<uint16_t>(s);
      ++m;
    }
  }
  *single = m == 1 ? w.leaf_sym[0] : -1;
  if (m <= 1) return m;  // empty, or one symbol coded in 0 bits
  SortLeaves(w, m);
  for (;;) {  // ends: 256 symbols always fit in 2^11 codes
    for (int i = 0; i < m; ++i) w.weight[i] = w.leaf_freq[i];
    int next_leaf = 0, next_inner = m, end_inner = m;
    for (int k = 0; k + 1 < m; ++k) {
      int ab[2];
      for (int q = 0; q < 2; ++q) {
        if (next_leaf < m &&
            (next_inner == end_inner || w.weight[next_leaf] <= w.weight[next_inner])) {
          ab[q] = next_leaf++;
        } else {
          ab[q] = next_inner++;
        }
      }
      w.weight[end_inner] = w.weight[ab[0]] + w.weight[ab[1]];
      w.parent[ab[0]] = w.parent[ab[1]] = static_cast<int16_t>(end_inner);
      ++end_inner;
    }
    // The root is the last inner node; parents always come after their children.
    w.depth[end_inner - 1] = 0;
    int max_len = 0;
    for (int i = end_inner - 1; i-- > 0;) {
      w.depth[i] = static_cast<uint8_t>(w.depth[w.parent[i]] + 1);
      if (i < m && w.depth[i] > max_len) max_len = w.depth[i];
    }
    for (int i = 0; i < m; ++i) len[w.leaf_sym[i]] = w.depth[i];
    if (max_len <= kMaxCodeLen) return m;
    for (int i = 0; i < m; ++i) w.leaf_freq[i] = (w.leaf_freq[i] + 1) / 2;
    SortLeaves(w, m);
  }
}

GCOMP_HD uint16_t ReverseBits(uint32_t code, int len) {
  uint32_t r = 0;
  for (int i = 0; i < len; ++i) r |= ((code >> i) & 1u) << (len - 1 - i);
  return static_cast<uint16_t>(r);
}

// Canonical codes from the lengths (by length, then symbol), bit-reversed for LSB-first
// emission, into code[0, 256).
GCOMP_HD void AssignCodes(const uint8_t* len, int alphabet, uint16_t* code) {
  int count[kMaxCodeLen + 2] = {};
  for (int s = 0; s < 256; ++s) code[s] = 0;
  for (int s = 0; s < alphabet; ++s) ++count[len[s]];
  count[0] = 0;
  uint32_t next[kMaxCodeLen + 2] = {};
  uint32_t c = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    c = (c + count[l - 1]) << 1;
    next[l] = c;
  }
  for (int s = 0; s < alphabet; ++s) {
    const int l = len[s];
    if (l > 0) code[s] = ReverseBits(next[l]++, l);
  }
}

// The symbols a serialized table spans: lowest `lo` to highest `hi` with a code.
GCOMP_HD void TableRange(const uint8_t* len, int alphabet, int single, int* lo, int* hi) {
  if (single >= 0) {
    *lo = *hi = single;
    return;
  }
  *lo = *hi = -1;
  for (int s = 0; s < alphabet; ++s) {
    if (len[s] > 0) {
      if (*lo < 0) *lo = s;
      *hi = s;
    }
  }
}

// Bytes of the serialized table of symbols lo..hi: lo, hi - lo, then 4-bit lengths.
GCOMP_HD uint32_t TableBytes(int lo, int hi) { return 2 + static_cast<uint32_t>(hi - lo + 2) / 2; }

// Serializes the table of symbols lo..hi (TableRange) of the lengths len: hands its
// TableBytes(lo, hi) bytes in order to put(uint8_t), so that each codec stores them its own
// way (the CPU into a string, the GPU through a bit writer). Returns the byte count.
template <typename PutByte>
GCOMP_HD uint32_t WriteTable(const uint8_t* len, int lo, int hi, PutByte&& put) {
  put(static_cast<uint8_t>(lo));
  put(static_cast<uint8_t>(hi - lo));
  for (int s = lo; s <= hi; s += 2) {
    put(static_cast<uint8_t>(len[s] | (s + 1 <= hi ? len[s + 1] : 0) << 4));
  }
  return TableBytes(lo, hi);
}

// The first rule a serialized table breaks.
enum class TableError : int32_t {
  kOk = 0,
  kTooShort,
  kOutsideAlphabet,  // symbols past the alphabet
  kSizeMismatch,     // size does not match the symbol count
  kLengthTooLong,    // a length above kMaxCodeLen
  kBadPadding,       // the unused high nibble is not zero
  kIncomplete,       // lengths do not form a complete prefix code
};

// Parses a serialized table of `size` bytes into len[0, 256) and checks that it is a complete
// prefix code within the alphabet. *present gets the number of symbols with a code (1 and
// *single >= 0 for a one-symbol code, which takes 0 bits per symbol).
GCOMP_HD TableError ParseTable(const uint8_t* t, size_t size, int alphabet, uint8_t* len,
                               int* single, int* present) {
  for (int s = 0; s < 256; ++s) len[s] = 0;
  *single = -1;
  *present = 0;
  if (size < 2) return TableError::kTooShort;
  const int lo = t[0];
  const int count = t[1] + 1;
  if (lo + count > alphabet) return TableError::kOutsideAlphabet;
  if (size != 2 + static_cast<size_t>((count + 1) / 2)) return TableError::kSizeMismatch;
  uint32_t kraft = 0;
  int used = 0;
  for (int i = 0; i < count; ++i) {
    const int l = (t[2 + i / 2] >> (4 * (i & 1))) & 15;
    if (l > kMaxCodeLen) return TableError::kLengthTooLong;
    len[lo + i] = static_cast<uint8_t>(l);
    if (l > 0) {
      kraft += 1u << (kMaxCodeLen - l);
      ++used;
    }
  }
  if (count % 2 == 1 && (t[size - 1] >> 4) != 0) return TableError::kBadPadding;
  if (count == 1 && used == 0) {
    *single = lo;
    *present = 1;
    return TableError::kOk;
  }
  if (used < 2 || kraft != (1u << kMaxCodeLen)) return TableError::kIncomplete;
  *present = used;
  return TableError::kOk;
}

}  // namespace gcomp::format

#endif  // GCOMP_FORMAT_HUFFMAN_CODE_H_
