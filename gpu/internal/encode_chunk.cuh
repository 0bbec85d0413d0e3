// The per-chunk encoder the kernels run (docs/FORMAT.md specifies every byte): EncodeChunk, and
// its phases in the order it runs them. Every worker of the team calls every phase; a phase ends
// at a barrier (team.Sync()) unless its comment says otherwise, and follows the discipline of
// team.cuh: what a later phase reads is in EncodeShared.
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_ENCODE_CHUNK_CUH_
#define GCOMP_GPU_INTERNAL_ENCODE_CHUNK_CUH_

#include <cstdint>

#include "format/block_format.h"
#include "format/block_header.h"
#include "format/checksum.h"
#include "format/huffman_code.h"
#include "format/portable.h"
#include "gpu/internal/bit_io.cuh"
#include "gpu/internal/kernel_format.cuh"
#include "gpu/internal/team.cuh"

namespace gcomp::gpu::internal {

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
  // The header: counts, kinds and section sizes as the phases decide them; WriteHeader adds
  // the dtype, policy and emax (and stores it as a stored block's where sh.stored).
  fmt::BlockHeader hdr;
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

// ---------------------------------------------------------------------------------------------
// What several phases use: the element transform, the streams' split, the section offsets.

// One element after the transform: whether it is coded (nz), its exponent symbol, and its sign
// + mantissa bits (`bits` of them, in `value`).
struct CodedElement {
  uint32_t nz, sym, value, bits;
};

// The element transform (docs/FORMAT.md: round to nearest, carry allowed). Reads sh.emax, sh.k
// and sh.drop, so it is made after ChooseMantissaWidths.
template <typename U>
class ElementCoder {
 public:
  GCOMP_HD ElementCoder(const FloatBits& lay, const BlockPolicy& pol, const EncodeShared& sh)
      : sh_(sh),
        M_(lay.mant_bits),
        top_(lay.total_bits - 1),
        mag_mask_((1u << top_) - 1),
        mant_mask_((1u << M_) - 1),
        zero_below_(ZeroBelow(pol, static_cast<int>(sh.emax))),
        zero_test_(pol.mode == 0 ? 0xffffffffu : mag_mask_) {}

  GCOMP_HD CodedElement operator()(U u) const {
    const uint32_t uu = static_cast<uint32_t>(u);
    const uint32_t mag = uu & mag_mask_;
    const uint32_t e = mag >> M_;
    CodedElement c;
    c.nz = (e >= zero_below_) & ((uu & zero_test_) != 0);
    const uint32_t drop = sh_.drop[e];
    const uint32_t r = (mag + ((1u << drop) >> 1)) & (~0u << drop);
    c.sym = r >> M_;
    const uint32_t k2 = sh_.k[c.sym];
    c.value = ((r & mant_mask_) >> (M_ - k2)) | ((uu >> top_) << k2);
    c.bits = k2 + 1;
    return c;
  }

 private:
  // Exponent fields below this are zeros in near-lossless mode (none in lossless mode).
  GCOMP_HD static uint32_t ZeroBelow(const BlockPolicy& pol, int emax) {
    if (pol.mode == 0) return 0u;
    return static_cast<uint32_t>(emax + pol.abs_log2 > 0 ? emax + pol.abs_log2 : 0);
  }

  const EncodeShared& sh_;
  const int M_;
  const int top_;
  const uint32_t mag_mask_;
  const uint32_t mant_mask_;
  const uint32_t zero_below_;
  const uint32_t zero_test_;
};

// Exponent bits are written by kPerStream workers per stream, each a contiguous piece of it.
inline constexpr int kPerStream = kTeamThreads / 4;

// Worker t's piece [*lo, *hi) of the symbols (indices into job.syms) of a chunk with nnz
// nonzeros.
GCOMP_HD void StreamPiece(int t, uint32_t nnz, uint32_t* lo, uint32_t* hi) {
  const int s = t / kPerStream, p = t % kPerStream;
  const uint32_t m = StreamCount(nnz, s), start = StreamStart(nnz, s);
  const uint32_t per = static_cast<uint32_t>(CeilDiv(m, kPerStream));
  const uint32_t a = p * per < m ? p * per : m;
  const uint32_t b = a + per < m ? a + per : m;
  *lo = start + a;
  *hi = start + b;
}

// Byte offsets of the sections after the sign + mantissa plane (which starts at kHeaderBytes).
struct SectionOffsets {
  uint64_t zmap;
  uint64_t table;
  uint64_t streams;
};
GCOMP_HD SectionOffsets SectionOffsetsOf(const EncodeShared& sh) {
  SectionOffsets o;
  o.zmap = kHeaderBytes + uint64_t{sh.hdr.mantissa_bytes};
  o.table = o.zmap + sh.hdr.zero_map_bytes;
  o.streams = o.table + sh.hdr.table_bytes;
  return o;
}

// ---------------------------------------------------------------------------------------------
// Phases.

// emax: the largest exponent field among finite elements. Also clears the symbol histogram
// that ListSymbols adds into.
template <typename U, class Team>
GCOMP_HD void FindLargestExponent(const Team& team, EncodeShared& sh, const FloatBits& lay,
                                  const EncodeJob<U>& job) {
  const int M = lay.mant_bits;
  const uint32_t mag_mask = (1u << (lay.total_bits - 1)) - 1;
  const uint32_t all_ones = static_cast<uint32_t>(lay.all_ones());
  const uint32_t n = job.n, seg = SegmentElems(n);
  team.ForEach([&](int t) {
    if (t == 0) sh.emax = 0;
    sh.hist[t] = 0;
  });
  team.Sync();
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    uint32_t m = 0;
    for (uint32_t i = lo; i < hi; ++i) {
      const uint32_t e = (static_cast<uint32_t>(job.in[i]) & mag_mask) >> M;
      const uint32_t f = e == all_ones ? 0 : e;
      m = f > m ? f : m;
    }
    if (m > 0) AtomicMax32(&sh.emax, m);
  });
  team.Sync();
}

// Per exponent field: the mantissa bits kept (k) and dropped before rounding (drop).
template <class Team>
GCOMP_HD void ChooseMantissaWidths(const Team& team, EncodeShared& sh, const FloatBits& lay,
                                   const BlockPolicy& pol) {
  const int M = lay.mant_bits;
  const int emax = static_cast<int>(sh.emax);
  team.ForEach([&](int t) {
    const int k = t < lay.alphabet() ? MantissaWidth(lay, pol, emax, t) : M;
    sh.k[t] = static_cast<uint8_t>(k);
    sh.drop[t] = static_cast<uint8_t>(M - k);
  });
  team.Sync();
}

// Per segment: the nonzero bitmap's words, and the segment's nonzeros, plane bits and last
// zero / nonzero positions.
template <typename U, class Team>
GCOMP_HD void MapNonzeros(const Team& team, EncodeShared& sh, const FloatBits& lay,
                          const BlockPolicy& pol, const EncodeJob<U>& job) {
  const ElementCoder<U> code_elem(lay, pol, sh);
  const uint32_t n = job.n, seg = SegmentElems(n);
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    uint32_t nnz = 0, last_zero = 0, last_nz = 0;
    uint64_t bits = 0;
    for (uint32_t w = lo; w < hi; w += 64) {
      uint64_t word = 0;
      const uint32_t wend = w + 64 < hi ? w + 64 : hi;
      for (uint32_t i = w; i < wend; ++i) {
        const CodedElement c = code_elem(job.in[i]);
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
}

// Worker 0: exclusive scans of MapNonzeros' per-segment results (kTeamThreads entries), and
// the totals nnz and mant_bytes. seg_last_* become "the position after the last listed one
// before this segment", the base of the segment's first gap.
template <class Team>
GCOMP_HD void ScanSegments(const Team& team, EncodeShared& sh) {
  OnWorker0(team, [&] {
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
    sh.hdr.nonzeros = nnz;
    sh.hdr.mantissa_bytes = static_cast<uint32_t>(CeilDiv(bits, 8));
  });
  team.Sync();
}

// The symbols in index order (job.syms), their histogram, and per segment the bytes of its
// part of both position lists.
template <typename U, class Team>
GCOMP_HD void ListSymbols(const Team& team, EncodeShared& sh, const FloatBits& lay,
                          const BlockPolicy& pol, const EncodeJob<U>& job) {
  const ElementCoder<U> code_elem(lay, pol, sh);
  const uint32_t n = job.n, seg = SegmentElems(n);
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    uint32_t j = sh.seg_nnz[t];
    for (uint32_t i = lo; i < hi; ++i) {
      const CodedElement c = code_elem(job.in[i]);
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
}

// Worker 0: exclusive scans of the position list sizes, and the smallest zero map kind.
template <class Team>
GCOMP_HD void ChooseZeroMap(const Team& team, EncodeShared& sh, uint32_t n) {
  OnWorker0(team, [&] {
    uint32_t zb = 0, nzb = 0;
    for (int i = 0; i < kTeamThreads; ++i) {
      const uint32_t a = sh.seg_zlist[i], b = sh.seg_nzlist[i];
      sh.seg_zlist[i] = zb;
      sh.seg_nzlist[i] = nzb;
      zb += a;
      nzb += b;
    }
    const uint32_t zeros = n - sh.hdr.nonzeros;
    if (zeros == 0) {
      sh.hdr.zero_map = fmt::kZeroMapNone;
      sh.hdr.zero_map_bytes = 0;
    } else {
      uint32_t best = (n + 7) / 8;
      sh.hdr.zero_map = fmt::kZeroMapBitmap;
      if (zb < best) best = zb, sh.hdr.zero_map = fmt::kZeroMapZeroPositions;
      if (nzb < best) best = nzb, sh.hdr.zero_map = fmt::kZeroMapNonzeroPositions;
      sh.hdr.zero_map_bytes = best;
    }
  });
  team.Sync();
}

// Worker 0: the Huffman code of the exponent symbols (lengths, codes) and its table's size;
// no table when there are no nonzeros.
template <class Team>
GCOMP_HD void BuildCode(const Team& team, EncodeShared& sh, const FloatBits& lay) {
  OnWorker0(team, [&] {
    sh.hdr.table = fmt::kTableNone;
    sh.hdr.table_bytes = 0;
    if (sh.hdr.nonzeros > 0) {
      BuildLengths(sh.hist, lay.alphabet(), sh.huff, sh.len, &sh.single);
      AssignCodes(sh.len, lay.alphabet(), sh.code);
      TableRange(sh.len, lay.alphabet(), sh.single, &sh.table_lo, &sh.table_hi);
      sh.hdr.table = fmt::kTableInline;
      sh.hdr.table_bytes = fmt::TableBytes(sh.table_lo, sh.table_hi);
    }
  });
  team.Sync();
}

// Exponent bits per stream piece, their exclusive scan within each stream (worker 0), and
// the streams' bytes.
template <typename U, class Team>
GCOMP_HD void SizeStreams(const Team& team, EncodeShared& sh, const EncodeJob<U>& job) {
  const uint32_t nnz = sh.hdr.nonzeros;
  team.ForEach([&](int t) {
    uint32_t lo, hi;
    StreamPiece(t, nnz, &lo, &hi);
    uint64_t bits = 0;
    if (sh.hdr.table != fmt::kTableNone) {
      for (uint32_t i = lo; i < hi; ++i) bits += sh.len[job.syms[i]];
    }
    sh.seg_ebits[t] = bits;
  });
  team.Sync();
  OnWorker0(team, [&] {
    for (int s = 0; s < 4; ++s) {
      uint64_t bits = 0;
      for (int p = 0; p < kPerStream; ++p) {
        const uint64_t b = sh.seg_ebits[s * kPerStream + p];
        sh.seg_ebits[s * kPerStream + p] = bits;
        bits += b;
      }
      sh.hdr.stream_bytes[s] = static_cast<uint32_t>(CeilDiv(bits, 8));
    }
  });
  team.Sync();
}

// Worker 0: the block's size, stored raw when coding would not make it smaller.
template <typename U, class Team>
GCOMP_HD void ChooseStoredOrCoded(const Team& team, EncodeShared& sh, const EncodeJob<U>& job) {
  OnWorker0(team, [&] {
    const uint32_t n = job.n;
    uint64_t payload = uint64_t{sh.hdr.mantissa_bytes} + sh.hdr.zero_map_bytes + sh.hdr.table_bytes;
    for (int s = 0; s < fmt::kNumStreams; ++s) payload += sh.hdr.stream_bytes[s];
    sh.stored = payload > uint64_t{n} * sizeof(U);
    sh.total = kHeaderBytes + (sh.stored ? n * static_cast<uint32_t>(sizeof(U))
                                         : static_cast<uint32_t>(payload));
  });
  team.Sync();
}

// Zeroes the block's words after the header: RangeBitWriter ORs into the words it shares.
template <class Team>
GCOMP_HD void ZeroSections(const Team& team, const EncodeShared& sh, uint8_t* out) {
  const uint32_t words = (sh.total + 3) / 4;
  team.ForEach([&](int t) {
    uint32_t* w = reinterpret_cast<uint32_t*>(out);
    for (uint32_t i = kHeaderBytes / 4 + t; i < words; i += kTeamThreads) w[i] = 0;
  });
  team.Sync();
}

// The writers of the sections below write disjoint bit ranges of the zeroed block (the words
// two ranges share are OR-ed atomically), so they end without a barrier: EncodeChunk syncs
// once after the last of them.

// A stored block's elements, as they are, except that near-lossless stores -0.0 as +0.0
// (as the CPU encoder does: zeros decode as +0.0). No barrier.
template <typename U, class Team>
GCOMP_HD void WriteStoredElements(const Team& team, const BlockPolicy& pol,
                                  const EncodeJob<U>& job) {
  const U minus_zero = static_cast<U>(U{1} << (8 * sizeof(U) - 1));
  const bool plus_zeros = pol.mode == 1;
  team.ForEach([&](int t) {
    U* raw = reinterpret_cast<U*>(job.out + kHeaderBytes);
    for (uint32_t i = t; i < job.n; i += kTeamThreads) {
      const U v = job.in[i];
      raw[i] = plus_zeros && v == minus_zero ? U{0} : v;
    }
  });
}

// The sign + mantissa plane, one bit range per segment. No barrier.
template <typename U, class Team>
GCOMP_HD void WritePlane(const Team& team, const EncodeShared& sh, const FloatBits& lay,
                         const BlockPolicy& pol, const EncodeJob<U>& job) {
  const ElementCoder<U> code_elem(lay, pol, sh);
  const uint32_t n = job.n, seg = SegmentElems(n);
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    if (lo >= hi) return;
    const uint64_t plane_end = (kHeaderBytes + uint64_t{sh.hdr.mantissa_bytes}) * 8;
    const uint64_t begin = kHeaderBytes * 8 + sh.seg_bits[t];
    const uint64_t end =
        t + 1 < kTeamThreads ? kHeaderBytes * 8 + sh.seg_bits[t + 1] : plane_end;
    RangeBitWriter w(job.out, begin, end);
    for (uint32_t i = lo; i < hi; ++i) {
      const CodedElement c = code_elem(job.in[i]);
      if (c.nz) w.Put(c.value, c.bits);
    }
    w.Finish();
  });
}

// The zero map of the chosen kind, one bit range per segment. No barrier.
template <typename U, class Team>
GCOMP_HD void WriteZeroMap(const Team& team, const EncodeShared& sh, const EncodeJob<U>& job) {
  const uint32_t n = job.n, seg = SegmentElems(n);
  const uint64_t zmap_off = SectionOffsetsOf(sh).zmap;
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    if (lo >= hi) return;
    if (sh.hdr.zero_map == fmt::kZeroMapBitmap) {
      const uint64_t begin = zmap_off * 8 + lo;
      const uint64_t end = zmap_off * 8 + (t + 1 < kTeamThreads && hi < n
                                               ? uint64_t{hi}
                                               : uint64_t{sh.hdr.zero_map_bytes} * 8);
      RangeBitWriter w(job.out, begin, end);
      for (uint32_t b = lo; b < hi; b += 64) {
        const uint32_t cnt = hi - b >= 64 ? 64 : hi - b;
        w.Put64(job.bitmap[b / 64], cnt);
      }
      w.Finish();
    } else if (sh.hdr.zero_map >= fmt::kZeroMapZeroPositions) {
      const bool want = sh.hdr.zero_map == fmt::kZeroMapNonzeroPositions;
      const uint32_t off = want ? sh.seg_nzlist[t] : sh.seg_zlist[t];
      const uint32_t next_off = t + 1 < kTeamThreads
                                    ? (want ? sh.seg_nzlist[t + 1] : sh.seg_zlist[t + 1])
                                    : sh.hdr.zero_map_bytes;
      RangeBitWriter w(job.out, (zmap_off + off) * 8, (zmap_off + next_off) * 8);
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
}

// The exponent streams, one piece per worker (StreamPiece). No barrier.
template <typename U, class Team>
GCOMP_HD void WriteStreams(const Team& team, const EncodeShared& sh, const EncodeJob<U>& job) {
  if (sh.hdr.table == fmt::kTableNone) return;
  const uint32_t nnz = sh.hdr.nonzeros;
  const uint64_t streams_off = SectionOffsetsOf(sh).streams;
  team.ForEach([&](int t) {
    const int s = t / kPerStream;
    uint64_t stream_base = streams_off;
    for (int i = 0; i < s; ++i) stream_base += sh.hdr.stream_bytes[i];
    uint32_t lo, hi;
    StreamPiece(t, nnz, &lo, &hi);
    const uint64_t begin = stream_base * 8 + sh.seg_ebits[t];
    const uint64_t end = (t + 1) % kPerStream != 0 ? stream_base * 8 + sh.seg_ebits[t + 1]
                                                   : (stream_base + sh.hdr.stream_bytes[s]) * 8;
    RangeBitWriter w(job.out, begin, end);
    for (uint32_t i = lo; i < hi; ++i) {
      const uint32_t sym = job.syms[i];
      w.Put(sh.code[sym], sh.len[sym]);
    }
    w.Finish();
  });
}

// Worker 0: the inline code table (format::WriteTable's bytes, through the bit writer: the
// words it shares with the plane or streams are OR-ed). No barrier.
template <class Team>
GCOMP_HD void WriteCodeTable(const Team& team, const EncodeShared& sh, uint8_t* out) {
  if (sh.hdr.table != fmt::kTableInline) return;
  const uint64_t table_off = SectionOffsetsOf(sh).table;
  OnWorker0(team, [&] {
    RangeBitWriter w(out, table_off * 8, (table_off + sh.hdr.table_bytes) * 8);
    fmt::WriteTable(sh.len, sh.table_lo, sh.table_hi, [&](uint8_t b) { w.Put(b, 8); });
    w.Finish();
  });
}

// Worker 0: completes sh.hdr, writes header bytes 0..47 and the checksum's seed from them.
template <typename U, class Team>
GCOMP_HD void WriteHeader(const Team& team, EncodeShared& sh, int dtype_code,
                          const BlockPolicy& pol, const EncodeJob<U>& job) {
  OnWorker0(team, [&] {
    fmt::BlockHeader& h = sh.hdr;
    h.version = fmt::kBlockVersion;
    h.dtype = static_cast<uint8_t>(dtype_code);
    h.mode = static_cast<uint8_t>(pol.mode);
    h.rel_bits = static_cast<uint8_t>(pol.rel_bits);
    h.abs_log2 = static_cast<int8_t>(pol.abs_log2);
    h.emax = static_cast<uint8_t>(sh.emax);
    h.elements = job.n;
    if (sh.stored) h = fmt::StoredHeader(h);
    fmt::WriteHeader(h, job.out);
    sh.xx_seed = fmt::BlockChecksumSeed(job.out);
  });
  team.Sync();
}

// Checksum lanes (workers 0-3), then the checksum and the block's size (worker 0). The last
// phase: no barrier.
template <typename U, class Team>
GCOMP_HD void WriteChecksum(const Team& team, EncodeShared& sh, const EncodeJob<U>& job) {
  const uint32_t total = sh.total;
  const uint32_t payload = total - kHeaderBytes;
  const uint8_t* const sections = job.out + kHeaderBytes;
  team.ForEach([&](int t) {
    if (t < 4 && payload >= 32) sh.xx_lane[t] = XxLane(sections, payload, sh.xx_seed, t);
  });
  team.Sync();
  OnWorker0(team, [&] {
    fmt::StoreBlockChecksum(job.out, XxFinish(sections, payload, sh.xx_seed, sh.xx_lane));
    *job.out_size = total;
  });
}

// ---------------------------------------------------------------------------------------------

// Encodes job.in[0, job.n) into one block at job.out and its size into *job.out_size. Every
// worker of `team` calls it; `sh` is the team's shared state.
template <typename U, class Team>
GCOMP_HD void EncodeChunk(const Team& team, EncodeShared& sh, int dtype_code,
                          const BlockPolicy pol, const EncodeJob<U>& job) {
  const FloatBits lay = FloatBitsOfCode(dtype_code);
  FindLargestExponent(team, sh, lay, job);
  ChooseMantissaWidths(team, sh, lay, pol);
  MapNonzeros(team, sh, lay, pol, job);
  ScanSegments(team, sh);
  ListSymbols(team, sh, lay, pol, job);
  ChooseZeroMap(team, sh, job.n);
  BuildCode(team, sh, lay);
  SizeStreams(team, sh, job);
  ChooseStoredOrCoded(team, sh, job);
  ZeroSections(team, sh, job.out);
  if (sh.stored) {
    WriteStoredElements(team, pol, job);
  } else {
    WritePlane(team, sh, lay, pol, job);
    WriteZeroMap(team, sh, job);
    WriteStreams(team, sh, job);
    WriteCodeTable(team, sh, job.out);
  }
  team.Sync();
  WriteHeader(team, sh, dtype_code, pol, job);
  WriteChecksum(team, sh, job);
}

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_ENCODE_CHUNK_CUH_
