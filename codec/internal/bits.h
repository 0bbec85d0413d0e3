// LSB-first bit writer/reader with 64-bit accumulators (the byte order is format/endian.h's).
// Internal to codec/; see docs/FORMAT.md for the bit order.
#ifndef GCOMP_CODEC_INTERNAL_BITS_H_
#define GCOMP_CODEC_INTERNAL_BITS_H_

#include <cstddef>
#include <cstdint>

#include "format/endian.h"

namespace gcomp::codec::internal {

// Writes bits LSB-first. Requires 8 writable bytes past the last byte it will emit, and at
// most 56 bits put between two Flush() calls.
class BitWriter {
 public:
  explicit BitWriter(uint8_t* p) : begin_(p), p_(p) {}
  // `v` must have no bits at or above `n`; n may be 0.
  inline void Put(uint64_t v, unsigned n) {
    acc_ |= v << fill_;
    fill_ += n;
  }
  inline void Flush() {
    format::StoreLE64(p_, acc_);
    p_ += fill_ >> 3;
    acc_ >>= (fill_ & 56);
    fill_ &= 7;
  }
  // Flushes the rest, zero-padding the last byte; returns bytes written.
  size_t Finish() {
    Flush();
    if (fill_ > 0) {
      format::StoreLE64(p_, acc_);
      ++p_;
      fill_ = 0;
      acc_ = 0;
    }
    return static_cast<size_t>(p_ - begin_);
  }

 private:
  uint8_t* begin_;
  uint8_t* p_;
  uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

// Writes the same LSB-first bits as BitWriter, 64-bit words at a time: a Put takes up to 64
// bits and needs no Flush (fewer instructions when values come in large pieces). Requires 8
// writable bytes past the last byte it will emit.
class WordWriter {
 public:
  explicit WordWriter(uint8_t* p) : begin_(p), p_(p) {}
  // `v` must have no bits at or above `n`; n <= 64.
  inline void Put(uint64_t v, unsigned n) {
    const uint64_t acc = acc_ | (v << fill_);  // fill_ < 64
    format::StoreLE64(p_, acc);
    const unsigned t = fill_ + n;
    // The bits of v past the word: v >> (64 - fill_), written so that fill_ == 0 gives 0.
    const uint64_t rest = (v >> 1) >> (63 - fill_);
    // Whether the word filled up is as good as random: select with masks, not branches.
    const uint64_t full = t >> 6;    // 0 or 1
    const uint64_t keep = full - 1;  // all ones when the word is not full
    p_ += full << 3;
    acc_ = (acc & keep) | (rest & ~keep);
    fill_ = t & 63;
  }
  // Writes the rest, zero-padding the last byte; returns bytes written.
  size_t Finish() {
    format::StoreLE64(p_, acc_);
    p_ += (fill_ + 7) / 8;
    acc_ = 0;
    fill_ = 0;
    return static_cast<size_t>(p_ - begin_);
  }

 private:
  uint8_t* begin_;
  uint8_t* p_;
  uint64_t acc_ = 0;
  unsigned fill_ = 0;
};

// Reads bits LSB-first from [begin, end) without ever touching bytes outside it. Past the
// end it reads zeros; Exhausted() tells whether the consumed bits fill exactly the buffer.
class BitReader {
 public:
  BitReader(const uint8_t* begin, size_t size) : begin_(begin), size_(size) {}
  // Starts `bit` bits into the buffer (lets a faster unchecked loop hand over its tail).
  BitReader(const uint8_t* begin, size_t size, size_t bit)
      : begin_(begin), size_(size), pos_(bit / 8) {
    if (bit % 8 != 0) {
      Refill();
      Consume(bit % 8);
    }
  }
  // After Refill(), at least 56 bits are available to Peek/Consume.
  inline void Refill() {
    if (pos_ + 8 <= size_) {
      buf_ |= format::LoadLE64(begin_ + pos_) << cnt_;
      pos_ += (63 - cnt_) >> 3;
      cnt_ |= 56;
    } else {
      RefillSlow();
    }
  }
  inline uint64_t Peek() const { return buf_; }
  inline void Consume(unsigned n) {
    buf_ >>= n;
    cnt_ -= n;
  }
  // Bits consumed so far (may exceed 8 * size when the data was short).
  size_t ConsumedBits() const { return pos_ * 8 - cnt_; }
  // True when the consumed bits end in the last byte and the padding bits are zero.
  bool AtExactEnd() const {
    size_t bits = ConsumedBits();
    if ((bits + 7) / 8 != size_) return false;
    if (bits % 8 == 0) return true;
    unsigned pad = 8 - bits % 8;
    return (begin_[size_ - 1] >> (8 - pad)) == 0;
  }

 private:
  void RefillSlow() {
    while (cnt_ < 56) {
      uint64_t b = pos_ < size_ ? begin_[pos_] : 0;
      // Bits at and above cnt_ may already hold these same bits from a fast refill.
      buf_ = (buf_ & ((uint64_t{1} << cnt_) - 1)) | (b << cnt_);
      ++pos_;
      cnt_ += 8;
    }
  }

  const uint8_t* begin_;
  size_t size_;
  size_t pos_ = 0;  // next byte to load (virtual: may pass size_)
  uint64_t buf_ = 0;
  unsigned cnt_ = 0;  // valid bits in buf_
};

}  // namespace gcomp::codec::internal

#endif  // GCOMP_CODEC_INTERNAL_BITS_H_
