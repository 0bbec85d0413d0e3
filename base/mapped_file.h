// A file's bytes mapped read-only into memory. For a large input that is read once (the
// gcomp CLI), reading it into a fresh buffer costs more than the work done on it: the
// buffer is zero-filled, every page of it faults, and the data is copied from the page
// cache. A private read-only mapping shares the page cache's pages instead.
#ifndef GCOMP_BASE_MAPPED_FILE_H_
#define GCOMP_BASE_MAPPED_FILE_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/files.h"

namespace gcomp {

struct MappedFileOptions {
  // Map every page at open (MAP_POPULATE): one system call instead of a page fault per few
  // pages read. Turn it off for a file read once, front to back, a window at a time
  // (Prefetch, Release): mapping all of it at open makes the whole file resident at once.
  bool populate = true;
  // The most bytes read from a file that cannot be mapped (a pipe, a device): more is
  // refused with FailedPrecondition, so that a path at /dev/zero is not read for good.
  uint64_t max_unmapped_bytes = kMaxUnsizedReadBytes;
};

class MappedFile {
 public:
  // NotFound naming the file (and why) if it cannot be opened, DataLoss if it cannot be
  // read. Files that cannot be mapped (pipes, /proc, empty files) are read into memory
  // instead. A file truncated by another process while mapped makes later reads of the
  // lost pages fault (SIGBUS): use it for inputs nobody rewrites in place.
  static absl::StatusOr<MappedFile> Open(const std::string& path,
                                         const MappedFileOptions& options = {});

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::string_view bytes() const;

  // Hints for reading a mapped file a window at a time; the bytes stay readable whatever
  // is called, and both do nothing for a file that was read into memory. Ranges are
  // clipped to the file.
  // Maps the pages of [offset, offset + size) now, so that reading them does not fault
  // (MADV_POPULATE_READ; where the kernel lacks it, MADV_WILLNEED).
  void Prefetch(size_t offset, size_t size) const;
  // Unmaps the pages wholly inside [offset, offset + size) from this process
  // (MADV_DONTNEED), so that its resident memory stays a window of the file; reading them
  // again maps them back from the page cache.
  void Release(size_t offset, size_t size) const;

 private:
  MappedFile() = default;
  void Unmap();
  std::pair<char*, size_t> PageRange(size_t offset, size_t size, bool inward) const;

  void* map_ = nullptr;
  size_t size_ = 0;
  std::string read_;  // the bytes when the file was read instead of mapped
};

}  // namespace gcomp

#endif  // GCOMP_BASE_MAPPED_FILE_H_
