// Scratch memory of half a megabyte or more, mapped in 2 MiB pages where the kernel allows.
#ifndef GCOMP_BASE_LARGE_BUFFER_H_
#define GCOMP_BASE_LARGE_BUFFER_H_

#include <cstddef>
#include <cstdint>

namespace gcomp {

// Bytes that grow on demand and are never zero-filled by the program, for buffers that are
// written before they are read (a block being encoded, a window of decoded values).
//
// Why not a vector: a fresh megabyte faults in page by page, 256 faults of 4 KiB, and on
// the virtual machines measured here a fault costs about 10 us, so a short-lived process
// (the CLI) spent more on first touches than on the codec. From kHugeBytes on, the memory
// is a 2 MiB-aligned anonymous mapping with MADV_HUGEPAGE: with transparent huge pages in
// "madvise" or "always" mode (the usual settings), each 2 MiB then costs one fault
// (measured: 0.17 ms against 3.0 ms for 1 MiB). Elsewhere it is ordinary memory. Smaller
// requests use operator new, so that the many small buffers of a busy process do not each
// hold 2 MiB; at the threshold a buffer holds at most 4 times what it asked for.
//
// Not thread-safe; move-only.
class LargeBuffer {
 public:
  static constexpr size_t kHugeBytes = size_t{512} << 10;

  LargeBuffer() = default;
  LargeBuffer(LargeBuffer&& other) noexcept;
  LargeBuffer& operator=(LargeBuffer&& other) noexcept;
  LargeBuffer(const LargeBuffer&) = delete;
  LargeBuffer& operator=(const LargeBuffer&) = delete;
  ~LargeBuffer();

  // At least `bytes` of memory aligned to 64 bytes; what it held is not kept when it grows.
  // Aborts (as operator new does) when the memory cannot be had.
  uint8_t* Reserve(size_t bytes);

  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  // Whether the memory is a mapping advised to use huge pages (for tests).
  bool mapped() const { return mapped_; }

 private:
  void Release();

  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
  void* mapping_ = nullptr;  // the mapping when mapped_ (it starts at data_)
  size_t mapping_bytes_ = 0;
  bool mapped_ = false;
};

}  // namespace gcomp

#endif  // GCOMP_BASE_LARGE_BUFFER_H_
