#include "base/large_buffer.h"

#include <sys/mman.h>

#include <new>
#include <utility>

namespace gcomp {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kAlign = 64;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

// An empty buffer takes over `other`'s memory: the assignment's Release has nothing to do.
LargeBuffer::LargeBuffer(LargeBuffer&& other) noexcept { *this = std::move(other); }

LargeBuffer& LargeBuffer::operator=(LargeBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapping_bytes_ = std::exchange(other.mapping_bytes_, 0);
    mapped_ = std::exchange(other.mapped_, false);
  }
  return *this;
}

LargeBuffer::~LargeBuffer() { Release(); }

void LargeBuffer::Release() {
  if (mapped_) {
    munmap(mapping_, mapping_bytes_);
  } else if (data_ != nullptr) {
    ::operator delete(data_, std::align_val_t{kAlign});
  }
  data_ = nullptr;
  capacity_ = 0;
  mapping_ = nullptr;
  mapping_bytes_ = 0;
  mapped_ = false;
}

uint8_t* LargeBuffer::Reserve(size_t bytes) {
  if (bytes <= capacity_ && data_ != nullptr) return data_;
  Release();
  if (bytes >= kHugeBytes) {
    // Map one huge page more than needed and start at the first 2 MiB boundary inside, so
    // that whole huge pages cover the buffer.
    // The slack before and after that stretch is unmapped again.
    const size_t want = RoundUp(bytes, kHugePage);
    void* map = mmap(nullptr, want + kHugePage, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map != MAP_FAILED) {
      auto* const first = static_cast<uint8_t*>(map);
      auto* const start = reinterpret_cast<uint8_t*>(
          RoundUp(reinterpret_cast<uintptr_t>(first), kHugePage));
      if (start > first) munmap(first, static_cast<size_t>(start - first));
      const size_t tail = kHugePage - static_cast<size_t>(start - first);
      if (tail > 0) munmap(start + want, tail);
      madvise(start, want, MADV_HUGEPAGE);  // advice only: without THP the pages are small
      mapping_ = start;
      mapping_bytes_ = want;
      mapped_ = true;
      data_ = start;
      capacity_ = want;
      return data_;
    }
  }
  data_ = static_cast<uint8_t*>(::operator new(RoundUp(bytes, kAlign), std::align_val_t{kAlign}));
  capacity_ = RoundUp(bytes, kAlign);
  return data_;
}

}  // namespace gcomp
