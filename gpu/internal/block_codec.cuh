// The per-chunk GComp encoder and decoder the GPU kernels run, written once as
// __host__ __device__ code over a "team" of kTeamThreads workers. On the device a team is one
// CUDA thread block (ForEach runs the body on every thread, Sync is __syncthreads); on the
// host a team is a loop over the same worker ids (HostTeam), which lets CPU-only tests run
// this exact code and compare its bytes with codec/. docs/FORMAT.md specifies every byte.
//
// Discipline that keeps both executions equivalent: state that lives across a Sync() is in
// the Shared struct (CUDA __shared__ memory, or one host object), never in locals of the
// driver; a body passed to ForEach touches only its own worker's slots, or uses the Atomic*
// helpers, or runs on worker 0 alone.
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_BLOCK_CODEC_CUH_
#define GCOMP_GPU_INTERNAL_BLOCK_CODEC_CUH_

#include <cstddef>
#include <cstdint>

#include "format/block_format.h"
#include "format/block_header.h"
#include "format/huffman_code.h"
#include "format/portable.h"

namespace gcomp::gpu::internal {

// The format's one definition (format/): constants, header rules, Huffman code construction.
namespace fmt = ::gcomp::format;
using fmt::AssignCodes;
using fmt::BuildLengths;
using fmt::CeilDiv;
using fmt::FloatBits;
using fmt::FloatBitsOfCode;
using fmt::HuffmanWork;
using fmt::kDecodeTableSize;
using fmt::kHeaderBytes;
using fmt::kMaxCodeLen;
using fmt::LoadLE32;
using fmt::LoadLE64;
using fmt::StreamCount;
using fmt::StreamStart;
using fmt::TableRange;
using fmt::VarintBytes;

inline constexpr int kTeamThreads = 256;  // also the symbol tables' size: one worker per symbol

// Per-block result codes written to device memory by the decoder; 0 is success.
enum BlockStatus : int32_t {
  kBlockOk = 0,
  kBlockTooShort,
  kBlockBadMagic,
  kBlockBadVersion,
  kBlockBadDType,
  kBlockBadPolicy,
  kBlockBadKind,
  kBlockBadEmax,
  kBlockBadCounts,
  kBlockBadSizeSum,
  kBlockBadSections,
  kBlockBadChecksum,
  kBlockBadTable,
  kBlockBadStream,
  kBlockBadZeroMap,
  kBlockBadPlane,
  kBlockWrongDType,
  kBlockWrongCount,
  kBlockTableReference,
  kBlockNumStatus,
};

// ---------------------------------------------------------------------------------------------
// Teams and atomics.

// Runs the workers one after another, in ascending order or in the order `order` gives (a
// permutation of the worker ids): a result that depends on the order between two Sync()
// calls would be a race on the device.
struct HostTeam {
  const int* order = nullptr;
  template <class F>
  GCOMP_HD void ForEach(F&& f) const {
    for (int t = 0; t < kTeamThreads; ++t) f(order != nullptr ? order[t] : t);
  }
  GCOMP_HD void Sync() const {}
};

struct DeviceTeam {
  template <class F>
  GCOMP_HD void ForEach(F&& f) const {
#ifdef __CUDA_ARCH__
    f(static_cast<int>(threadIdx.x));
#endif
  }
  GCOMP_HD void Sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
};

GCOMP_HD void AtomicOr32(uint32_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  atomicOr(reinterpret_cast<unsigned int*>(p), v);
#else
  *p |= v;
#endif
}
GCOMP_HD void AtomicAdd32(uint32_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  atomicAdd(reinterpret_cast<unsigned int*>(p), v);
#else
  *p += v;
#endif
}
GCOMP_HD void AtomicMax32(uint32_t* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  atomicMax(reinterpret_cast<unsigned int*>(p), v);
#else
  if (v > *p) *p = v;
#endif
}

GCOMP_HD int Ctz64(uint64_t v) {
#ifdef __CUDA_ARCH__
  return __ffsll(static_cast<long long>(v)) - 1;
#else
  return __builtin_ctzll(v);
#endif
}
GCOMP_HD int Popc64(uint64_t v) {
#ifdef __CUDA_ARCH__
  return __popcll(v);
#else
  return __builtin_popcountll(v);
#endif
}

// ---------------------------------------------------------------------------------------------
// Bytes, dtypes, policies.

struct BlockPolicy {
  int mode;  // 0 lossless, 1 near-lossless
  int rel_bits;
  int abs_log2;
};

// Mantissa bits kept for symbol s (docs/FORMAT.md, "the mantissa widths").
GCOMP_HD int MantissaWidth(const FloatBits& lay, const BlockPolicy& p, int emax, int s) {
  return fmt::MantissaWidth(lay, p.mode, p.rel_bits, p.abs_log2, emax, s);
}

// Elements are read and written as unsigned integers of the dtype's width.
template <typename U>
GCOMP_HD U LoadElemBytes(const uint8_t* p) {
  if (sizeof(U) == 4) return static_cast<U>(LoadLE32(p));
  return static_cast<U>(p[0] | p[1] << 8);
}

// ---------------------------------------------------------------------------------------------
// XXH64 (xxHash's 64-bit hash), serial.

inline constexpr uint64_t kP1 = 0x9E3779B185EBCA87ULL;
inline constexpr uint64_t kP2 = 0xC2B2AE3D27D4EB4FULL;
inline constexpr uint64_t kP3 = 0x165667B19E3779F9ULL;
inline constexpr uint64_t kP4 = 0x85EBCA77C2B2AE63ULL;
inline constexpr uint64_t kP5 = 0x27D4EB2F165667C5ULL;

GCOMP_HD uint64_t Rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
GCOMP_HD uint64_t XxRound(uint64_t acc, uint64_t in) {
  acc += in * kP2;
  acc = Rotl64(acc, 31);
  return acc * kP1;
}
GCOMP_HD uint64_t XxMerge(uint64_t acc, uint64_t v) {
  acc ^= XxRound(0, v);
  return acc * kP1 + kP4;
}

// 8 bytes at p: one load where p is 8-byte aligned (device memory, block payloads), else bytes.
GCOMP_HD uint64_t Load64Any(const uint8_t* p) {
#ifdef __CUDA_ARCH__
  if ((reinterpret_cast<uintptr_t>(p) & 7) == 0) return *reinterpret_cast<const uint64_t*>(p);
#endif
  return LoadLE64(p);
}

// XXH64 splits input of >= 32 bytes into 32-byte stripes and runs 4 independent accumulators
// ("lanes") over the 4 words of each stripe; lanes can therefore run on 4 workers. XxLane is
// lane `lane` over every full stripe; XxFinish merges the lanes and hashes the tail.
GCOMP_HD uint64_t XxLane(const uint8_t* p, size_t len, uint64_t seed, int lane) {
  const uint64_t init[4] = {seed + kP1 + kP2, seed + kP2, seed, seed - kP1};
  uint64_t v = init[lane];
  const size_t stripes = len / 32;
  const uint8_t* q = p + 8 * lane;
  for (size_t i = 0; i < stripes; ++i, q += 32) v = XxRound(v, Load64Any(q));
  return v;
}

GCOMP_HD uint64_t XxFinish(const uint8_t* p, size_t len, uint64_t seed, const uint64_t* lanes) {
  const uint8_t* const end = p + len;
  uint64_t h;
  if (len >= 32) {
    h = Rotl64(lanes[0], 1) + Rotl64(lanes[1], 7) + Rotl64(lanes[2], 12) + Rotl64(lanes[3], 18);
    for (int i = 0; i < 4; ++i) h = XxMerge(h, lanes[i]);
    p += len / 32 * 32;
  } else {
    h = seed + kP5;
  }
  h += static_cast<uint64_t>(len);
  while (p + 8 <= end) {
    h ^= XxRound(0, LoadLE64(p));
    h = Rotl64(h, 27) * kP1 + kP4;
    p += 8;
  }
  if (p + 4 <= end) {
    h ^= static_cast<uint64_t>(LoadLE32(p)) * kP1;
    h = Rotl64(h, 23) * kP2 + kP3;
    p += 4;
  }
  while (p < end) {
    h ^= static_cast<uint64_t>(*p) * kP5;
    h = Rotl64(h, 11) * kP1;
    ++p;
  }
  h ^= h >> 33;
  h *= kP2;
  h ^= h >> 29;
  h *= kP3;
  h ^= h >> 32;
  return h;
}

GCOMP_HD uint64_t Xxh64(const uint8_t* p, size_t len, uint64_t seed) {
  uint64_t lanes[4] = {};
  if (len >= 32) {
    for (int i = 0; i < 4; ++i) lanes[i] = XxLane(p, len, seed, i);
  }
  return XxFinish(p, len, seed, lanes);
}

// The block checksum: XXH64 of the sections seeded with XXH64 of header bytes 0..47. The
// codec drivers compute it in three steps (seed; 4 lanes on 4 workers; finish):
GCOMP_HD uint64_t ChecksumSeed(const uint8_t* block) { return Xxh64(block, fmt::kOffChecksum, 0); }

// ---------------------------------------------------------------------------------------------
// Bit I/O.

// Writes one worker's bit range [begin_bit, end_bit) of a block whose base is 4-byte aligned,
// LSB-first. 32-bit words wholly inside the range are stored; words shared with a
// neighbouring range are OR-ed atomically, so the block must have been zeroed first.
class RangeBitWriter {
 public:
  GCOMP_HD RangeBitWriter(uint8_t* base, uint64_t begin_bit, uint64_t end_bit)
      : words_(reinterpret_cast<uint32_t*>(base)),
        begin_(begin_bit),
        end_(end_bit),
        word_(begin_bit >> 5),
        fill_(static_cast<unsigned>(begin_bit & 31)) {}
  // `v` has no bits at or above n; n <= 32.
  GCOMP_HD void Put(uint32_t v, unsigned n) {
    acc_ |= static_cast<uint64_t>(v) << fill_;
    fill_ += n;
    if (fill_ >= 32) {
      Emit(static_cast<uint32_t>(acc_));
      acc_ >>= 32;
      fill_ -= 32;
      ++word_;
    }
  }
  GCOMP_HD void Put64(uint64_t v, unsigned n) {
    if (n > 32) {
      Put(static_cast<uint32_t>(v), 32);
      Put(static_cast<uint32_t>(v >> 32), n - 32);
    } else {
      Put(static_cast<uint32_t>(v), n);
    }
  }
  GCOMP_HD void Finish() {
    if (fill_ > 0) Emit(static_cast<uint32_t>(acc_));
    acc_ = 0;
    fill_ = 0;
  }

 private:
  GCOMP_HD void Emit(uint32_t w) {
    const uint64_t lo = word_ << 5;
    if (lo >= begin_ && lo + 32 <= end_) {
      words_[word_] = w;
    } else if (w != 0) {
      AtomicOr32(&words_[word_], w);
    }
  }
  uint32_t* words_;
  uint64_t begin_;
  uint64_t end_;
  uint64_t word_;
  unsigned fill_;
  uint64_t acc_ = 0;
};

// Reads bits LSB-first from [begin, begin + size) starting at bit `start_bit`, never touching
// bytes outside it; past the end it reads zeros. Same semantics as codec's BitReader.
class ByteBitReader {
 public:
  GCOMP_HD ByteBitReader(const uint8_t* begin, size_t size, uint64_t start_bit = 0)
      : begin_(begin), size_(size), pos_(start_bit >> 3) {
    Refill();
    Consume(static_cast<unsigned>(start_bit & 7));
  }
  // Afterwards at least 56 bits are available.
  GCOMP_HD void Refill() {
    while (cnt_ < 56) {
      const uint64_t b = pos_ < size_ ? begin_[pos_] : 0;
      buf_ |= b << cnt_;
      ++pos_;
      cnt_ += 8;
    }
  }
  GCOMP_HD uint64_t Peek() const { return buf_; }
  GCOMP_HD void Consume(unsigned n) {
    buf_ >>= n;
    cnt_ -= n;
  }
  GCOMP_HD uint64_t ConsumedBits() const { return pos_ * 8 - cnt_; }
  GCOMP_HD bool AtExactEnd() const {
    const uint64_t bits = ConsumedBits();
    if ((bits + 7) / 8 != size_) return false;
    if (bits % 8 == 0) return true;
    const unsigned pad = 8 - bits % 8;
    return (begin_[size_ - 1] >> (8 - pad)) == 0;
  }

 private:
  const uint8_t* begin_;
  size_t size_;
  uint64_t pos_;
  uint64_t buf_ = 0;
  unsigned cnt_ = 0;
};

// ---------------------------------------------------------------------------------------------
// Segments.

// Elements per worker segment: a multiple of 64, so bitmap words have a single owner.
GCOMP_HD uint32_t SegmentElems(uint32_t n) {
  const uint32_t per = static_cast<uint32_t>(CeilDiv(n, kTeamThreads));
  const uint32_t r = (per + 63) / 64 * 64;
  return r == 0 ? 64 : r;
}

// ---------------------------------------------------------------------------------------------
// Encoder.

// Shared state of one chunk's encode (CUDA __shared__ memory on the device).
struct EncodeShared {
  uint32_t emax;
  uint8_t k[256];
  uint8_t drop[256];
  uint32_t hist[256];
  uint8_t len[256];
  uint16_t code[256];
  int single;
  int table_lo;
  int table_hi;
  // Per worker: nonzeros, sign + mantissa bits, last zero / nonzero position + 1 (0: none),
  // position list bytes (zeros, nonzeros), exponent bits of its stream piece.
  uint32_t seg_nnz[kTeamThreads];
  uint64_t seg_bits[kTeamThreads];
  uint32_t seg_last_zero[kTeamThreads];
  uint32_t seg_last_nz[kTeamThreads];
  uint32_t seg_zlist[kTeamThreads];
  uint32_t seg_nzlist[kTeamThreads];
  uint64_t seg_ebits[kTeamThreads];
  // Totals and section layout.
  uint32_t nnz;
  uint32_t mant_bytes;
  uint32_t zmap_kind;
  uint32_t zmap_bytes;
  uint32_t table_kind;
  uint32_t table_bytes;
  uint32_t stream_bytes[4];
  uint32_t total;
  bool stored;
  uint64_t xx_seed;
  uint64_t xx_lane[4];
  HuffmanWork huff;
};

// One chunk to encode; `out` is 8-byte aligned with room for RoundUp(56 + n * bytes, 8).
template <typename U>
struct EncodeJob {
  const U* in;
  uint32_t n;
  uint8_t* out;
  uint8_t* syms;     // scratch, n bytes
  uint64_t* bitmap;  // scratch, ceil(n / 64) words
  uint32_t* out_size;
};

template <typename U, class Team>
GCOMP_HD void EncodeChunk(const Team& team, EncodeShared& sh, int dtype_code,
                          const BlockPolicy pol, const EncodeJob<U>& job) {
  const FloatBits lay = FloatBitsOfCode(dtype_code);
  const int M = lay.mant_bits;
  const int top = lay.total_bits - 1;
  const uint32_t mag_mask = (1u << top) - 1;
  const uint32_t mant_mask = (1u << M) - 1;
  const uint32_t all_ones = static_cast<uint32_t>(lay.all_ones());
  const bool lossless = pol.mode == 0;
  const uint32_t n = job.n;
  const uint32_t seg = SegmentElems(n);
  const U* const in = job.in;
  uint8_t* const out = job.out;

  // 1. emax: the largest exponent field among finite elements.
  team.ForEach([&](int t) {
    if (t == 0) sh.emax = 0;
    sh.hist[t] = 0;
  });
  team.Sync();
  team.ForEach([&](int t) {
    const uint32_t lo = t * seg, hi = lo + seg < n ? lo + seg : n;
    uint32_t m = 0;
    for (uint32_t i = lo; i < hi; ++i) {
      const uint32_t e = (static_cast<uint32_t>(in[i]) & mag_mask) >> M;
      const uint32_t f = e == all_ones ? 0 : e;
      m = f > m ? f : m;
    }
    if (m > 0) AtomicMax32(&sh.emax, m);
  });
  team.Sync();
  const int emax = static_cast<int>(sh.emax);
  const uint32_t zero_below =
      lossless ? 0u : static_cast<uint32_t>(emax + pol.abs_log2 > 0 ? emax + pol.abs_log2 : 0);
  const uint32_t zero_test = lossless ? 0xffffffffu : mag_mask;
  team.ForEach([&](int t) {
    const int k = t < lay.alphabet() ? MantissaWidth(lay, pol, emax, t) : M;
    sh.k[t] = static_cast<uint8_t>(k);
    sh.drop[t] = static_cast<uint8_t>(M - k);
  });
  team.Sync();

  // Element transform (docs/FORMAT.md: round to nearest, carry allowed).
  struct Coded {
    uint32_t nz, sym, value, bits;
  };
  auto code_elem = [&](U u) -> Coded {
    const uint32_t uu = static_cast<uint32_t>(u);
    const uint32_t mag = uu & mag_mask;
    const uint32_t e = mag >> M;
    Coded c;
    c.nz = (e >= zero_below) & ((uu & zero_test) != 0);
    const uint32_t drop = sh.drop[e];
    const uint32_t r = (mag + ((1u << drop) >> 1)) & (~0u << drop);
    c.sym = r >> M;
    const uint32_t k2 = sh.k[c.sym];
    c.value = ((r & mant_mask) >> (M - k2)) | ((uu >> top) << k2);
    c.bits = k2 + 1;
    return c;
  };

  // 2. Per segment: nonzeros, plane bits, bitmap words, last zero / nonzero positions.
  team.ForEach([&](int t) {
    const uint32_t lo = t * seg, hi = lo + seg < n ? lo + seg : n;
    uint32_t nnz = 0, last_zero = 0, last_nz = 0;
    uint64_t bits = 0;
    for (uint32_t w = lo; w < hi; w += 64) {
      uint64_t word = 0;
      const uint32_t wend = w + 64 < hi ? w + 64 : hi;
      for (uint32_t i = w; i < wend; ++i) {
        const Coded c = code_elem(in[i]);
        if (c.nz) {
          ++nnz;
          bits += c.bits;
          word |= uint64_t{1} << (i - w);
          last_nz = i + 1;
        } else {
          last_zero = i + 1;
        }
      }
      job.bitmap[w / 64] = word;
    }
    sh.seg_nnz[t] = nnz;
    sh.seg_bits[t] = bits;
    sh.seg_last_zero[t] = last_zero;
    sh.seg_last_nz[t] = last_nz;
  });
  team.Sync();
  // Exclusive scans (worker 0; kTeamThreads entries). seg_last_* become "the position after
  // the last listed one before this segment", the base of the segment's first gap.
  team.ForEach([&](int t) {
    if (t != 0) return;
    uint32_t nnz = 0, prev_zero = 0, prev_nz = 0;
    uint64_t bits = 0;
    for (int i = 0; i < kTeamThreads; ++i) {
      const uint32_t a = sh.seg_nnz[i];
      const uint64_t b = sh.seg_bits[i];
      const uint32_t lz = sh.seg_last_zero[i], ln = sh.seg_last_nz[i];
      sh.seg_nnz[i] = nnz;
      sh.seg_bits[i] = bits;
      sh.seg_last_zero[i] = prev_zero;
      sh.seg_last_nz[i] = prev_nz;
      nnz += a;
      bits += b;
      if (lz) prev_zero = lz;
      if (ln) prev_nz = ln;
    }
    sh.nnz = nnz;
    sh.mant_bytes = static_cast<uint32_t>(CeilDiv(bits, 8));
  });
  team.Sync();

  // 3. Symbols in index order, their histogram, and the position list sizes per segment.
  team.ForEach([&](int t) {
    const uint32_t lo = t * seg, hi = lo + seg < n ? lo + seg : n;
    uint32_t j = sh.seg_nnz[t];
    for (uint32_t i = lo; i < hi; ++i) {
      const Coded c = code_elem(in[i]);
      if (c.nz) {
        job.syms[j++] = static_cast<uint8_t>(c.sym);
        AtomicAdd32(&sh.hist[c.sym], 1);
      }
    }
    uint32_t prev_zero = sh.seg_last_zero[t], prev_nz = sh.seg_last_nz[t];
    uint32_t zbytes = 0, nzbytes = 0;
    for (uint32_t w = lo; w < hi; w += 64) {
      const uint64_t valid = hi - w >= 64 ? ~uint64_t{0} : (uint64_t{1} << (hi - w)) - 1;
      uint64_t ones = job.bitmap[w / 64];
      uint64_t zeros = ~ones & valid;
      while (ones) {
        const uint32_t pos = w + Ctz64(ones);
        ones &= ones - 1;
        nzbytes += VarintBytes(pos - prev_nz);
        prev_nz = pos + 1;
      }
      while (zeros) {
        const uint32_t pos = w + Ctz64(zeros);
        zeros &= zeros - 1;
        zbytes += VarintBytes(pos - prev_zero);
        prev_zero = pos + 1;
      }
    }
    sh.seg_zlist[t] = zbytes;
    sh.seg_nzlist[t] = nzbytes;
  });
  team.Sync();

  // 4. Worker 0: zero map kind, code lengths and codes, table size.
  team.ForEach([&](int t) {
    if (t != 0) return;
    uint32_t zb = 0, nzb = 0;
    for (int i = 0; i < kTeamThreads; ++i) {
      const uint32_t a = sh.seg_zlist[i], b = sh.seg_nzlist[i];
      sh.seg_zlist[i] = zb;
      sh.seg_nzlist[i] = nzb;
      zb += a;
      nzb += b;
    }
    const uint32_t nnz = sh.nnz, zeros = n - nnz;
    if (zeros == 0) {
      sh.zmap_kind = fmt::kZeroMapNone;
      sh.zmap_bytes = 0;
    } else {
      uint32_t best = (n + 7) / 8;
      sh.zmap_kind = fmt::kZeroMapBitmap;
      if (zb < best) best = zb, sh.zmap_kind = fmt::kZeroMapZeroPositions;
      if (nzb < best) best = nzb, sh.zmap_kind = fmt::kZeroMapNonzeroPositions;
      sh.zmap_bytes = best;
    }
    sh.table_kind = fmt::kTableNone;
    sh.table_bytes = 0;
    if (nnz > 0) {
      BuildLengths(sh.hist, lay.alphabet(), sh.huff, sh.len, &sh.single);
      AssignCodes(sh.len, lay.alphabet(), sh.code);
      TableRange(sh.len, lay.alphabet(), sh.single, &sh.table_lo, &sh.table_hi);
      sh.table_kind = fmt::kTableInline;
      sh.table_bytes = 2 + (sh.table_hi - sh.table_lo + 2) / 2;
    }
  });
  team.Sync();

  // 5. Exponent bits per piece: 64 workers per stream, each a contiguous piece of it.
  const uint32_t nnz = sh.nnz;
  constexpr int kPerStream = kTeamThreads / 4;
  auto piece = [&](int t, uint32_t* lo, uint32_t* hi) {
    const int s = t / kPerStream, p = t % kPerStream;
    const uint32_t m = StreamCount(nnz, s), start = StreamStart(nnz, s);
    const uint32_t per = static_cast<uint32_t>(CeilDiv(m, kPerStream));
    const uint32_t a = p * per < m ? p * per : m;
    const uint32_t b = a + per < m ? a + per : m;
    *lo = start + a;
    *hi = start + b;
  };
  team.ForEach([&](int t) {
    uint32_t lo, hi;
    piece(t, &lo, &hi);
    uint64_t bits = 0;
    if (sh.table_kind != 0) {
      for (uint32_t i = lo; i < hi; ++i) bits += sh.len[job.syms[i]];
    }
    sh.seg_ebits[t] = bits;
  });
  team.Sync();
  team.ForEach([&](int t) {
    if (t != 0) return;
    for (int s = 0; s < 4; ++s) {
      uint64_t bits = 0;
      for (int p = 0; p < kPerStream; ++p) {
        const uint64_t b = sh.seg_ebits[s * kPerStream + p];
        sh.seg_ebits[s * kPerStream + p] = bits;
        bits += b;
      }
      sh.stream_bytes[s] = static_cast<uint32_t>(CeilDiv(bits, 8));
    }
    uint64_t payload = uint64_t{sh.mant_bytes} + sh.zmap_bytes + sh.table_bytes;
    for (int s = 0; s < 4; ++s) payload += sh.stream_bytes[s];
    sh.stored = payload > uint64_t{n} * sizeof(U);
    sh.total = kHeaderBytes + (sh.stored ? n * static_cast<uint32_t>(sizeof(U))
                                         : static_cast<uint32_t>(payload));
  });
  team.Sync();

  // 6. Zero the block's words, then write the sections.
  const uint32_t total = sh.total;
  const uint32_t words = (total + 3) / 4;
  team.ForEach([&](int t) {
    uint32_t* w = reinterpret_cast<uint32_t*>(out);
    for (uint32_t i = kHeaderBytes / 4 + t; i < words; i += kTeamThreads) w[i] = 0;
  });
  team.Sync();
  const uint64_t zmap_off = kHeaderBytes + uint64_t{sh.mant_bytes};
  const uint64_t table_off = zmap_off + sh.zmap_bytes;
  const uint64_t streams_off = table_off + sh.table_bytes;
  if (sh.stored) {
    team.ForEach([&](int t) {
      U* raw = reinterpret_cast<U*>(out + kHeaderBytes);
      for (uint32_t i = t; i < n; i += kTeamThreads) raw[i] = in[i];
    });
  } else {
    team.ForEach([&](int t) {
      const uint32_t lo = t * seg, hi = lo + seg < n ? lo + seg : n;
      if (lo >= hi) return;
      // Sign + mantissa plane.
      {
        const uint64_t begin = kHeaderBytes * 8 + sh.seg_bits[t];
        const uint64_t end = t + 1 < kTeamThreads ? kHeaderBytes * 8 + sh.seg_bits[t + 1]
                                                  : (kHeaderBytes + uint64_t{sh.mant_bytes}) * 8;
        RangeBitWriter w(out, begin, end);
        for (uint32_t i = lo; i < hi; ++i) {
          const Coded c = code_elem(in[i]);
          if (c.nz) w.Put(c.value, c.bits);
        }
        w.Finish();
      }
      // Zero map.
      if (sh.zmap_kind == fmt::kZeroMapBitmap) {
        const uint64_t begin = zmap_off * 8 + lo;
        const uint64_t end = zmap_off * 8 + (t + 1 < kTeamThreads && hi < n
                                                 ? uint64_t{hi}
                                                 : uint64_t{sh.zmap_bytes} * 8);
        RangeBitWriter w(out, begin, end);
        for (uint32_t b = lo; b < hi; b += 64) {
          const uint32_t cnt = hi - b >= 64 ? 64 : hi - b;
          w.Put64(job.bitmap[b / 64], cnt);
        }
        w.Finish();
      } else if (sh.zmap_kind >= fmt::kZeroMapZeroPositions) {
        const bool want = sh.zmap_kind == fmt::kZeroMapNonzeroPositions;
        const uint32_t off = want ? sh.seg_nzlist[t] : sh.seg_zlist[t];
        const uint32_t next_off = t + 1 < kTeamThreads
                                      ? (want ? sh.seg_nzlist[t + 1] : sh.seg_zlist[t + 1])
                                      : sh.zmap_bytes;
        RangeBitWriter w(out, (zmap_off + off) * 8, (zmap_off + next_off) * 8);
        uint32_t prev = want ? sh.seg_last_nz[t] : sh.seg_last_zero[t];
        for (uint32_t b = lo; b < hi; b += 64) {
          const uint64_t valid = hi - b >= 64 ? ~uint64_t{0} : (uint64_t{1} << (hi - b)) - 1;
          uint64_t bits = want ? job.bitmap[b / 64] : ~job.bitmap[b / 64] & valid;
          while (bits) {
            const uint32_t pos = b + Ctz64(bits);
            bits &= bits - 1;
            uint32_t v = pos - prev;
            while (v >= 128) {
              w.Put((v & 127u) | 128u, 8);
              v >>= 7;
            }
            w.Put(v, 8);
            prev = pos + 1;
          }
        }
        w.Finish();
      }
    });
    team.ForEach([&](int t) {
      // Exponent stream pieces.
      if (sh.table_kind != 0) {
        const int s = t / kPerStream;
        uint64_t stream_base = streams_off;
        for (int i = 0; i < s; ++i) stream_base += sh.stream_bytes[i];
        uint32_t lo, hi;
        piece(t, &lo, &hi);
        const uint64_t begin = stream_base * 8 + sh.seg_ebits[t];
        const uint64_t end = (t + 1) % kPerStream != 0
                                 ? stream_base * 8 + sh.seg_ebits[t + 1]
                                 : (stream_base + sh.stream_bytes[s]) * 8;
        RangeBitWriter w(out, begin, end);
        for (uint32_t i = lo; i < hi; ++i) {
          const uint32_t sym = job.syms[i];
          w.Put(sh.code[sym], sh.len[sym]);
        }
        w.Finish();
      }
      // Code table.
      if (t == 0 && sh.table_kind == fmt::kTableInline) {
        RangeBitWriter w(out, table_off * 8, (table_off + sh.table_bytes) * 8);
        w.Put(static_cast<uint32_t>(sh.table_lo), 8);
        w.Put(static_cast<uint32_t>(sh.table_hi - sh.table_lo), 8);
        for (int s = sh.table_lo; s <= sh.table_hi; s += 2) {
          w.Put(sh.len[s] | (s + 1 <= sh.table_hi ? sh.len[s + 1] : 0) << 4, 8);
        }
        w.Finish();
      }
    });
  }
  team.Sync();

  // 7. Header (worker 0), checksum lanes (workers 0-3), checksum (worker 0).
  team.ForEach([&](int t) {
    if (t != 0) return;
    uint32_t h[12];
    const bool stored = sh.stored;
    h[0] = fmt::kBlockMagic;
    h[1] = uint32_t{fmt::kBlockVersion} | uint32_t(dtype_code) << 8 |
           uint32_t(pol.mode) << 16 | uint32_t(pol.rel_bits) << 24;
    const uint32_t zkind = stored ? fmt::kZeroMapNone : sh.zmap_kind;
    const uint32_t tkind = stored ? fmt::kTableStored : sh.table_kind;
    h[2] = uint32_t(static_cast<uint8_t>(static_cast<int8_t>(pol.abs_log2))) | zkind << 8 |
           tkind << 16 | sh.emax << 24;
    h[3] = n;
    h[4] = stored ? n : sh.nnz;
    h[5] = stored ? n * static_cast<uint32_t>(sizeof(U)) : sh.mant_bytes;
    h[6] = stored ? 0 : sh.zmap_bytes;
    h[7] = stored ? 0 : sh.table_bytes;
    for (int s = 0; s < 4; ++s) h[8 + s] = stored ? 0 : sh.stream_bytes[s];
    uint32_t* w = reinterpret_cast<uint32_t*>(out);
    for (int i = 0; i < 12; ++i) w[i] = h[i];
    sh.xx_seed = ChecksumSeed(out);
  });
  team.Sync();
  const uint32_t payload = total - kHeaderBytes;
  team.ForEach([&](int t) {
    if (t < 4 && payload >= 32) sh.xx_lane[t] = XxLane(out + kHeaderBytes, payload, sh.xx_seed, t);
  });
  team.Sync();
  team.ForEach([&](int t) {
    if (t != 0) return;
    const uint64_t sum = XxFinish(out + kHeaderBytes, payload, sh.xx_seed, sh.xx_lane);
    uint32_t* w = reinterpret_cast<uint32_t*>(out);
    w[12] = static_cast<uint32_t>(sum);
    w[13] = static_cast<uint32_t>(sum >> 32);
    *job.out_size = total;
  });
}

// ---------------------------------------------------------------------------------------------
// Decoder.

struct DecodeShared {
  int32_t status;
  uint64_t xx_seed;
  uint64_t xx_lane[4];
  // Header fields.
  uint32_t n, nnz, emax, zmap_kind, table_kind;
  uint32_t mant_bytes, zmap_bytes, table_bytes, stream_bytes[4];
  BlockPolicy pol;
  uint8_t k[256];
  uint8_t len[256];
  uint16_t code[256];
  int single;
  uint16_t table[kDecodeTableSize];
  uint32_t seg_nnz[kTeamThreads];
  uint64_t seg_bits[kTeamThreads];
  uint32_t ones;
};

template <typename U>
struct DecodeJob {
  const uint8_t* in;  // any alignment
  uint32_t in_size;
  U* out;              // `expected_n` elements
  uint32_t expected_n;
  uint8_t* syms;       // scratch, expected_n bytes
  uint64_t* bitmap;    // scratch, ceil(expected_n / 64) words
  int32_t* status;
};

// The per-block status of the first header rule a block breaks.
GCOMP_HD int32_t StatusOfHeaderError(fmt::HeaderError e) {
  using fmt::HeaderError;
  switch (e) {
    case HeaderError::kOk: return kBlockOk;
    case HeaderError::kTooShort: return kBlockTooShort;
    case HeaderError::kBadMagic: return kBlockBadMagic;
    case HeaderError::kBadVersion: return kBlockBadVersion;
    case HeaderError::kBadDType: return kBlockBadDType;
    case HeaderError::kBadMode:
    case HeaderError::kBadRelBits:
    case HeaderError::kBadAbsLog2: return kBlockBadPolicy;
    case HeaderError::kBadZeroMapKind:
    case HeaderError::kBadTableKind: return kBlockBadKind;
    case HeaderError::kBadEmax: return kBlockBadEmax;
    case HeaderError::kTooManyElements:
    case HeaderError::kTooManyNonzeros: return kBlockBadCounts;
    case HeaderError::kBadSizeSum: return kBlockBadSizeSum;
    default: return kBlockBadSections;  // the rules on each section's size
  }
}

// Header checks of docs/FORMAT.md before the checksum (format::ParseHeader, as the CPU
// decoder runs them); fills sh (and the checksum seed) on success.
GCOMP_HD int32_t ParseHeader(const uint8_t* h, uint32_t size, DecodeShared& sh) {
  fmt::BlockHeader b;
  const int32_t status = StatusOfHeaderError(fmt::ParseHeader(h, size, &b));
  if (status != kBlockOk) return status;
  sh.pol.mode = b.mode;
  sh.pol.rel_bits = b.rel_bits;
  sh.pol.abs_log2 = b.abs_log2;
  sh.zmap_kind = b.zero_map;
  sh.table_kind = b.table;
  sh.emax = b.emax;
  sh.n = b.elements;
  sh.nnz = b.nonzeros;
  sh.mant_bytes = b.mantissa_bytes;
  sh.zmap_bytes = b.zero_map_bytes;
  sh.table_bytes = b.table_bytes;
  for (int s = 0; s < fmt::kNumStreams; ++s) sh.stream_bytes[s] = b.stream_bytes[s];
  sh.xx_seed = ChecksumSeed(h);
  return kBlockOk;
}

// After the checksum: what the caller expects of the block.
GCOMP_HD int32_t CheckExpected(const uint8_t* h, int dtype_code, uint32_t expected_n,
                               const DecodeShared& sh) {
  if (h[fmt::kOffDType] != dtype_code) return kBlockWrongDType;
  if (sh.n != expected_n) return kBlockWrongCount;
  if (sh.table_kind == fmt::kTableReference) return kBlockTableReference;
  return kBlockOk;
}

// Reads the block's status, then waits until every worker has read it, so that no worker can
// set it in a later step while another is still deciding on the old value (which would let
// workers leave at different barriers).
template <class Team>
GCOMP_HD bool Failed(const Team& team, const DecodeShared& sh) {
  const bool failed = sh.status != kBlockOk;
  team.Sync();
  return failed;
}

template <typename U, class Team>
GCOMP_HD void DecodeChunk(const Team& team, DecodeShared& sh, int dtype_code,
                          const DecodeJob<U>& job) {
  const uint8_t* const blk = job.in;
  U* const out = job.out;
  // 1. Header and sizes (worker 0), checksum lanes (workers 0-3), checksum (worker 0).
  team.ForEach([&](int t) {
    if (t == 0) sh.status = ParseHeader(blk, job.in_size, sh);
  });
  team.Sync();
  const uint32_t payload = sh.status == kBlockOk ? job.in_size - kHeaderBytes : 0;
  team.ForEach([&](int t) {
    if (t < 4 && payload >= 32) sh.xx_lane[t] = XxLane(blk + kHeaderBytes, payload, sh.xx_seed, t);
  });
  team.Sync();
  team.ForEach([&](int t) {
    if (t != 0 || sh.status != kBlockOk) return;
    const uint64_t sum = XxFinish(blk + kHeaderBytes, payload, sh.xx_seed, sh.xx_lane);
    if (LoadLE64(blk + fmt::kOffChecksum) != sum) {
      sh.status = kBlockBadChecksum;
    } else {
      sh.status = CheckExpected(blk, dtype_code, job.expected_n, sh);
    }
  });
  team.Sync();
  if (Failed(team, sh)) {
    team.ForEach([&](int t) {
      if (t == 0) *job.status = sh.status;
    });
    return;
  }
  const FloatBits lay = FloatBitsOfCode(dtype_code);
  const uint32_t n = sh.n, nnz = sh.nnz;
  const uint8_t* const plane = blk + kHeaderBytes;
  if (sh.table_kind == fmt::kTableStored || nnz == 0) {  // stored, or no nonzeros
    const bool stored = sh.table_kind == fmt::kTableStored;
    team.ForEach([&](int t) {
      for (uint32_t i = t; i < n; i += kTeamThreads) {
        out[i] = stored ? LoadElemBytes<U>(plane + uint64_t{i} * sizeof(U)) : U{0};
      }
      if (t == 0) *job.status = kBlockOk;
    });
    return;
  }
  const uint8_t* const zmap = plane + sh.mant_bytes;
  const uint8_t* const tbl = zmap + sh.zmap_bytes;
  const uint8_t* const streams = tbl + sh.table_bytes;

  // 2. Code table (worker 0), then the 2048-entry decode table (all workers).
  team.ForEach([&](int t) {
    if (t != 0) return;
    int present = 0;
    if (fmt::ParseTable(tbl, sh.table_bytes, lay.alphabet(), sh.len, &sh.single, &present) !=
        fmt::TableError::kOk) {
      sh.status = kBlockBadTable;
      return;
    }
    if (sh.single < 0) AssignCodes(sh.len, lay.alphabet(), sh.code);
  });
  team.ForEach([&](int t) {
    const int k = t < lay.alphabet() ? MantissaWidth(lay, sh.pol, sh.emax, t) : lay.mant_bits;
    sh.k[t] = static_cast<uint8_t>(k);
  });
  team.Sync();
  if (Failed(team, sh)) {
    team.ForEach([&](int t) {
      if (t == 0) *job.status = sh.status;
    });
    return;
  }
  team.ForEach([&](int t) {
    if (sh.single >= 0) {
      for (int j = t; j < kDecodeTableSize; j += kTeamThreads) {
        sh.table[j] = static_cast<uint16_t>(sh.single);
      }
    } else if (t < lay.alphabet() && sh.len[t] > 0) {
      const int l = sh.len[t];
      for (uint32_t j = sh.code[t]; j < kDecodeTableSize; j += 1u << l) {
        sh.table[j] = static_cast<uint16_t>(t | l << 8);
      }
    }
  });
  team.Sync();

  // 3. Exponent streams: one worker each (the format has no sync points inside a stream).
  team.ForEach([&](int t) {
    if (t >= 4) return;
    uint64_t off = 0;
    for (int s = 0; s < t; ++s) off += sh.stream_bytes[s];
    ByteBitReader r(streams + off, sh.stream_bytes[t]);
    const uint32_t start = StreamStart(nnz, t), m = StreamCount(nnz, t);
    for (uint32_t i = 0; i < m; ++i) {
      r.Refill();
      const uint16_t e = sh.table[r.Peek() & (kDecodeTableSize - 1)];
      job.syms[start + i] = static_cast<uint8_t>(e);
      r.Consume(e >> 8);
    }
    if (!r.AtExactEnd()) sh.status = kBlockBadStream;
  });

  // 4. Zero map into the nonzero bitmap.
  const uint32_t words = (n + 63) / 64;
  const uint64_t last_mask = n % 64 ? (uint64_t{1} << (n % 64)) - 1 : ~uint64_t{0};
  if (sh.zmap_kind <= 1) {
    const bool none = sh.zmap_kind == fmt::kZeroMapNone;
    team.ForEach([&](int t) {
      for (uint32_t w = t; w < words; w += kTeamThreads) {
        uint64_t v;
        if (none) {
          v = w + 1 == words ? last_mask : ~uint64_t{0};
        } else {
          v = 0;
          const uint32_t lo = w * 8, hi = lo + 8 < sh.zmap_bytes ? lo + 8 : sh.zmap_bytes;
          for (uint32_t b = lo; b < hi; ++b) v |= uint64_t{zmap[b]} << (8 * (b - lo));
          if (w + 1 == words && (v & ~last_mask) != 0) sh.status = kBlockBadZeroMap;
        }
        job.bitmap[w] = v;
      }
    });
  } else {
    team.ForEach([&](int t) {
      if (t != 0) return;
      const bool want = sh.zmap_kind == fmt::kZeroMapNonzeroPositions;
      const uint32_t entries = want ? nnz : n - nnz;
      for (uint32_t w = 0; w < words; ++w) {
        job.bitmap[w] = want ? 0 : (w + 1 == words ? last_mask : ~uint64_t{0});
      }
      uint32_t p = 0;
      uint64_t next = 0;
      for (uint32_t e = 0; e < entries; ++e) {
        uint64_t gap = 0;
        for (int shift = 0;; shift += 7) {
          if (p >= sh.zmap_bytes || shift > 28) {
            sh.status = kBlockBadZeroMap;
            return;
          }
          const uint8_t b = zmap[p++];
          gap |= uint64_t{b & 127u} << shift;
          if (b < 128) break;
        }
        const uint64_t pos = next + gap;
        if (pos >= n) {
          sh.status = kBlockBadZeroMap;
          return;
        }
        job.bitmap[pos / 64] ^= uint64_t{1} << (pos % 64);
        next = pos + 1;
      }
      if (p != sh.zmap_bytes) sh.status = kBlockBadZeroMap;
    });
  }
  team.Sync();
  if (Failed(team, sh)) {
    team.ForEach([&](int t) {
      if (t == 0) *job.status = sh.status;
    });
    return;
  }

  // 5. Nonzeros per segment, then plane bits per segment, each with an exclusive scan.
  const uint32_t seg = SegmentElems(n);
  team.ForEach([&](int t) {
    const uint32_t lo = t * seg, hi = lo + seg < n ? lo + seg : n;
    uint32_t c = 0;
    for (uint32_t w = lo; w < hi; w += 64) c += Popc64(job.bitmap[w / 64]);
    sh.seg_nnz[t] = c;
  });
  team.Sync();
  team.ForEach([&](int t) {
    if (t != 0) return;
    uint32_t c = 0;
    for (int i = 0; i < kTeamThreads; ++i) {
      const uint32_t a = sh.seg_nnz[i];
      sh.seg_nnz[i] = c;
      c += a;
    }
    if (c != nnz) sh.status = kBlockBadZeroMap;
  });
  team.Sync();
  if (Failed(team, sh)) {
    team.ForEach([&](int t) {
      if (t == 0) *job.status = sh.status;
    });
    return;
  }
  team.ForEach([&](int t) {
    const uint32_t lo = t * seg, hi = lo + seg < n ? lo + seg : n;
    const uint32_t j0 = sh.seg_nnz[t];
    const uint32_t j1 = t + 1 < kTeamThreads ? sh.seg_nnz[t + 1] : nnz;
    uint64_t bits = 0;
    for (uint32_t j = j0; j < j1; ++j) bits += sh.k[job.syms[j]] + 1u;
    sh.seg_bits[t] = lo < hi ? bits : 0;
  });
  team.Sync();
  team.ForEach([&](int t) {
    if (t != 0) return;
    uint64_t bits = 0;
    for (int i = 0; i < kTeamThreads; ++i) {
      const uint64_t a = sh.seg_bits[i];
      sh.seg_bits[i] = bits;
      bits += a;
    }
    // The plane must end in its last byte with zero padding (codec: AtExactEnd).
    if (CeilDiv(bits, 8) != sh.mant_bytes) {
      sh.status = kBlockBadPlane;
    } else if (bits % 8 != 0 && (plane[sh.mant_bytes - 1] >> (bits % 8)) != 0) {
      sh.status = kBlockBadPlane;
    }
  });
  team.Sync();
  if (Failed(team, sh)) {
    team.ForEach([&](int t) {
      if (t == 0) *job.status = sh.status;
    });
    return;
  }

  // 6. Elements.
  const int M = lay.mant_bits, top = lay.total_bits - 1;
  team.ForEach([&](int t) {
    const uint32_t lo = t * seg, hi = lo + seg < n ? lo + seg : n;
    if (lo >= hi) return;
    ByteBitReader r(plane, sh.mant_bytes, sh.seg_bits[t]);
    uint32_t j = sh.seg_nnz[t];
    for (uint32_t w = lo; w < hi; w += 64) {
      const uint64_t word = job.bitmap[w / 64];
      const uint32_t wend = w + 64 < hi ? w + 64 : hi;
      for (uint32_t i = w; i < wend; ++i) {
        U value = 0;
        if ((word >> (i - w)) & 1) {
          r.Refill();
          const uint32_t sym = job.syms[j++];
          const uint32_t kk = sh.k[sym];
          const uint64_t v = r.Peek();
          const uint32_t mant = static_cast<uint32_t>(v) & ((1u << kk) - 1);
          const uint32_t sign = static_cast<uint32_t>(v >> kk) & 1;
          r.Consume(kk + 1);
          value = static_cast<U>((sign << top) | (sym << M) | (mant << (M - kk)));
        }
        out[i] = value;
      }
    }
    if (t == 0) *job.status = kBlockOk;
  });
}

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_BLOCK_CODEC_CUH_
