// Bit I/O for the kernels, LSB-first as docs/FORMAT.md writes every bit section:
// RangeBitWriter (one worker's bit range of a block under construction) and ByteBitReader.
//
// Included only by .cu files.
#ifndef GCOMP_GPU_INTERNAL_BIT_IO_CUH_
#define GCOMP_GPU_INTERNAL_BIT_IO_CUH_

#include <cstddef>
#include <cstdint>

#include "format/portable.h"
#include "gpu/internal/team.cuh"

namespace gcomp::gpu::internal {

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

}  // namespace gcomp::gpu::internal

#endif  // GCOMP_GPU_INTERNAL_BIT_IO_CUH_
