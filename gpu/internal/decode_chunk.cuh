// The per-chunk decoder the kernels run (docs/FORMAT.md specifies every byte; decoding never
// trusts its input): DecodeChunk, and its phases in the order it runs them. Every worker of the
// team calls every phase, following the discipline of team.cuh. A phase that can find the block
// damaged sets sh.status and ends without a barrier: DecodeChunk then calls StopIfFailed, which
// has one. Other phases end at a barrier unless their comment says otherwise.
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_DECODE_CHUNK_CUH_
#define GCOMP_GPU_INTERNAL_DECODE_CHUNK_CUH_

#include <cstdint>

#include "format/block_format.h"
#include "format/block_header.h"
#include "format/checksum.h"
#include "format/huffman_code.h"
#include "format/portable.h"
#include "gpu/internal/bit_io.cuh"
#include "gpu/internal/block_status.cuh"
#include "gpu/internal/kernel_format.cuh"
#include "gpu/internal/team.cuh"

namespace gcomp::gpu::internal {

// Shared state of one block's decode (CUDA __shared__ memory on the device).
struct DecodeShared {
  int32_t status;
  uint64_t xx_seed;
  uint64_t xx_lane[4];
  fmt::BlockHeader hdr;  // as format::ParseHeader reads it
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

// Header checks of docs/FORMAT.md before the checksum (format::ParseHeader, as the CPU
// decoder runs them); fills sh.hdr (and the checksum seed) on success.
GCOMP_HD int32_t ParseHeader(const uint8_t* h, uint32_t size, DecodeShared& sh) {
  const int32_t status = StatusOfHeaderError(fmt::ParseHeader(h, size, &sh.hdr));
  if (status != kBlockOk) return status;
  sh.xx_seed = fmt::BlockChecksumSeed(h);
  return kBlockOk;
}

// After the checksum: what the caller expects of the block.
GCOMP_HD int32_t CheckExpected(int dtype_code, uint32_t expected_n, const DecodeShared& sh) {
  if (sh.hdr.dtype != dtype_code) return kBlockWrongDType;
  if (sh.hdr.elements != expected_n) return kBlockWrongCount;
  if (sh.hdr.table == fmt::kTableReference) return kBlockTableReference;
  return kBlockOk;
}

// Ends a phase that can fail: waits for every worker, reads the block's status, then waits until
// every worker has read it, so that no worker can set it in a later phase while another is
// still deciding on the old value (which would let workers leave at different barriers). On
// failure worker 0 reports the status, and the caller returns.
template <typename U, class Team>
GCOMP_HD bool StopIfFailed(const Team& team, const DecodeShared& sh, const DecodeJob<U>& job) {
  team.Sync();
  const bool failed = sh.status != kBlockOk;
  team.Sync();
  if (failed) {
    OnWorker0(team, [&] { *job.status = sh.status; });
  }
  return failed;
}

// ---------------------------------------------------------------------------------------------
// Phases.

// Header checks (worker 0), checksum lanes (workers 0-3), then the checksum and the caller's
// expectations (worker 0). Can fail.
template <typename U, class Team>
GCOMP_HD void CheckHeaderAndChecksum(const Team& team, DecodeShared& sh, int dtype_code,
                                     const DecodeJob<U>& job) {
  const uint8_t* const blk = job.in;
  OnWorker0(team, [&] { sh.status = ParseHeader(blk, job.in_size, sh); });
  team.Sync();
  const uint32_t payload = sh.status == kBlockOk ? job.in_size - kHeaderBytes : 0;
  team.ForEach([&](int t) {
    if (t < 4 && payload >= 32) sh.xx_lane[t] = XxLane(blk + kHeaderBytes, payload, sh.xx_seed, t);
  });
  team.Sync();
  OnWorker0(team, [&] {
    if (sh.status != kBlockOk) return;
    const uint64_t sum = XxFinish(blk + kHeaderBytes, payload, sh.xx_seed, sh.xx_lane);
    if (fmt::LoadBlockChecksum(blk) != sum) {
      sh.status = kBlockBadChecksum;
    } else {
      sh.status = CheckExpected(dtype_code, job.expected_n, sh);
    }
  });
}

// A block without coded elements: stored raw, or no nonzeros. Writes every element and reports
// success. The last phase: no barrier.
template <typename U, class Team>
GCOMP_HD void DecodeStoredOrAllZero(const Team& team, const DecodeShared& sh,
                                    const DecodeJob<U>& job) {
  const uint32_t n = sh.hdr.elements;
  const uint8_t* const plane = job.in + kHeaderBytes;
  const bool stored = sh.hdr.table == fmt::kTableStored;
  team.ForEach([&](int t) {
    for (uint32_t i = t; i < n; i += kTeamThreads) {
      job.out[i] = stored ? LoadElemBytes<U>(plane + uint64_t{i} * sizeof(U)) : U{0};
    }
    if (t == 0) *job.status = kBlockOk;
  });
}

// Worker 0: the code table's lengths and, for more than one symbol, the codes. Can fail.
template <typename U, class Team>
GCOMP_HD void ReadCodeTable(const Team& team, DecodeShared& sh, const FloatBits& lay,
                            const DecodeJob<U>& job) {
  const uint8_t* const tbl = job.in + kHeaderBytes + sh.hdr.mantissa_bytes + sh.hdr.zero_map_bytes;
  OnWorker0(team, [&] {
    int present = 0;
    if (fmt::ParseTable(tbl, sh.hdr.table_bytes, lay.alphabet(), sh.len, &sh.single, &present) !=
        fmt::TableError::kOk) {
      sh.status = kBlockBadTable;
      return;
    }
    if (sh.single < 0) AssignCodes(sh.len, lay.alphabet(), sh.code);
  });
}

// The mantissa width k of every symbol. No barrier: the caller's StopIfFailed follows.
template <class Team>
GCOMP_HD void ReadMantissaWidths(const Team& team, DecodeShared& sh, const FloatBits& lay) {
  team.ForEach([&](int t) {
    const int k = t < lay.alphabet() ? MantissaWidth(lay, sh.hdr, t) : lay.mant_bits;
    sh.k[t] = static_cast<uint8_t>(k);
  });
}

// The kDecodeTableSize-entry decode table: symbol | code length << 8 for every code's suffixes.
template <class Team>
GCOMP_HD void FillDecodeTable(const Team& team, DecodeShared& sh, const FloatBits& lay) {
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
}

// The exponent streams into job.syms: one worker each (the format has no sync points inside a
// stream). Can fail; no barrier, so ReadZeroMap runs alongside it.
template <typename U, class Team>
GCOMP_HD void DecodeStreams(const Team& team, DecodeShared& sh, const DecodeJob<U>& job) {
  const uint32_t nnz = sh.hdr.nonzeros;
  const uint8_t* const streams =
      job.in + kHeaderBytes + sh.hdr.mantissa_bytes + sh.hdr.zero_map_bytes + sh.hdr.table_bytes;
  team.ForEach([&](int t) {
    if (t >= 4) return;
    uint64_t off = 0;
    for (int s = 0; s < t; ++s) off += sh.hdr.stream_bytes[s];
    ByteBitReader r(streams + off, sh.hdr.stream_bytes[t]);
    const uint32_t start = StreamStart(nnz, t), m = StreamCount(nnz, t);
    for (uint32_t i = 0; i < m; ++i) {
      r.Refill();
      const uint16_t e = sh.table[r.Peek() & (kDecodeTableSize - 1)];
      job.syms[start + i] = static_cast<uint8_t>(e);
      r.Consume(e >> 8);
    }
    if (!r.AtExactEnd()) sh.status = kBlockBadStream;
  });
}

// The zero map into the nonzero bitmap (job.bitmap): a bitmap or none on all workers, a
// position list on worker 0. Can fail.
template <typename U, class Team>
GCOMP_HD void ReadZeroMap(const Team& team, DecodeShared& sh, const DecodeJob<U>& job) {
  const uint32_t n = sh.hdr.elements, nnz = sh.hdr.nonzeros;
  const uint8_t* const zmap = job.in + kHeaderBytes + sh.hdr.mantissa_bytes;
  const uint32_t words = (n + 63) / 64;
  const uint64_t last_mask = n % 64 ? (uint64_t{1} << (n % 64)) - 1 : ~uint64_t{0};
  if (sh.hdr.zero_map <= 1) {
    const bool none = sh.hdr.zero_map == fmt::kZeroMapNone;
    team.ForEach([&](int t) {
      for (uint32_t w = t; w < words; w += kTeamThreads) {
        uint64_t v;
        if (none) {
          v = w + 1 == words ? last_mask : ~uint64_t{0};
        } else {
          const uint32_t size = sh.hdr.zero_map_bytes;
          const uint32_t lo = w * 8, hi = lo + 8 < size ? lo + 8 : size;
          v = lo < hi ? fmt::LoadLE64Prefix(zmap + lo, hi - lo) : 0;
          if (w + 1 == words && (v & ~last_mask) != 0) sh.status = kBlockBadZeroMap;
        }
        job.bitmap[w] = v;
      }
    });
    return;
  }
  OnWorker0(team, [&] {
    const bool want = sh.hdr.zero_map == fmt::kZeroMapNonzeroPositions;
    const uint32_t entries = want ? nnz : n - nnz;
    for (uint32_t w = 0; w < words; ++w) {
      job.bitmap[w] = want ? 0 : (w + 1 == words ? last_mask : ~uint64_t{0});
    }
    uint32_t p = 0;
    uint64_t next = 0;
    for (uint32_t e = 0; e < entries; ++e) {
      uint64_t gap = 0;
      for (int shift = 0;; shift += 7) {
        if (p >= sh.hdr.zero_map_bytes || shift > 28) {
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
    if (p != sh.hdr.zero_map_bytes) sh.status = kBlockBadZeroMap;
  });
}

// Nonzeros per segment and their exclusive scan (worker 0), which must total the header's
// count. Can fail.
template <typename U, class Team>
GCOMP_HD void CountSegmentNonzeros(const Team& team, DecodeShared& sh, const DecodeJob<U>& job) {
  const uint32_t n = sh.hdr.elements, nnz = sh.hdr.nonzeros, seg = SegmentElems(n);
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    uint32_t c = 0;
    for (uint32_t w = lo; w < hi; w += 64) c += Popc64(job.bitmap[w / 64]);
    sh.seg_nnz[t] = c;
  });
  team.Sync();
  OnWorker0(team, [&] {
    uint32_t c = 0;
    for (int i = 0; i < kTeamThreads; ++i) {
      const uint32_t a = sh.seg_nnz[i];
      sh.seg_nnz[i] = c;
      c += a;
    }
    if (c != nnz) sh.status = kBlockBadZeroMap;
  });
}

// Plane bits per segment and their exclusive scan (worker 0); the plane must end in its last
// byte with zero padding (codec: AtExactEnd). Can fail.
template <typename U, class Team>
GCOMP_HD void LocatePlaneBits(const Team& team, DecodeShared& sh, const DecodeJob<U>& job) {
  const uint32_t n = sh.hdr.elements, nnz = sh.hdr.nonzeros, seg = SegmentElems(n);
  const uint8_t* const plane = job.in + kHeaderBytes;
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    const uint32_t j0 = sh.seg_nnz[t];
    const uint32_t j1 = t + 1 < kTeamThreads ? sh.seg_nnz[t + 1] : nnz;
    uint64_t bits = 0;
    for (uint32_t j = j0; j < j1; ++j) bits += sh.k[job.syms[j]] + 1u;
    sh.seg_bits[t] = lo < hi ? bits : 0;
  });
  team.Sync();
  OnWorker0(team, [&] {
    uint64_t bits = 0;
    for (int i = 0; i < kTeamThreads; ++i) {
      const uint64_t a = sh.seg_bits[i];
      sh.seg_bits[i] = bits;
      bits += a;
    }
    if (CeilDiv(bits, 8) != sh.hdr.mantissa_bytes) {
      sh.status = kBlockBadPlane;
    } else if (bits % 8 != 0 && (plane[sh.hdr.mantissa_bytes - 1] >> (bits % 8)) != 0) {
      sh.status = kBlockBadPlane;
    }
  });
}

// The elements, one segment per worker, and success. The last phase: no barrier.
template <typename U, class Team>
GCOMP_HD void WriteElements(const Team& team, const DecodeShared& sh, const FloatBits& lay,
                            const DecodeJob<U>& job) {
  const uint32_t n = sh.hdr.elements, seg = SegmentElems(n);
  const uint8_t* const plane = job.in + kHeaderBytes;
  const int M = lay.mant_bits, top = lay.total_bits - 1;
  team.ForEach([&](int t) {
    const auto [lo, hi] = SegmentOf(t, seg, n);
    if (lo >= hi) return;
    ByteBitReader r(plane, sh.hdr.mantissa_bytes, sh.seg_bits[t]);
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
        job.out[i] = value;
      }
    }
    if (t == 0) *job.status = kBlockOk;
  });
}

// ---------------------------------------------------------------------------------------------

// Decodes the block job.in[0, job.in_size) into job.out[0, job.expected_n) and its verdict into
// *job.status (kBlockOk, or the first rule the block breaks). Every worker of `team` calls it;
// `sh` is the team's shared state.
template <typename U, class Team>
GCOMP_HD void DecodeChunk(const Team& team, DecodeShared& sh, int dtype_code,
                          const DecodeJob<U>& job) {
  CheckHeaderAndChecksum(team, sh, dtype_code, job);
  if (StopIfFailed(team, sh, job)) return;
  if (sh.hdr.table == fmt::kTableStored || sh.hdr.nonzeros == 0) {
    DecodeStoredOrAllZero(team, sh, job);
    return;
  }
  const FloatBits lay = FloatBitsOfCode(dtype_code);
  ReadCodeTable(team, sh, lay, job);
  ReadMantissaWidths(team, sh, lay);
  if (StopIfFailed(team, sh, job)) return;
  FillDecodeTable(team, sh, lay);
  DecodeStreams(team, sh, job);
  ReadZeroMap(team, sh, job);
  if (StopIfFailed(team, sh, job)) return;
  CountSegmentNonzeros(team, sh, job);
  if (StopIfFailed(team, sh, job)) return;
  LocatePlaneBits(team, sh, job);
  if (StopIfFailed(team, sh, job)) return;
  WriteElements(team, sh, lay, job);
}

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_DECODE_CHUNK_CUH_
