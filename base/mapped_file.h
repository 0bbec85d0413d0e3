// A file's bytes mapped read-only into memory. For a large input that is read once (the
// gcomp CLI), reading it into a fresh buffer costs more than the work done on it: the
// buffer is zero-filled, every page of it faults, and the data is copied from the page
// cache. A private read-only mapping shares the page cache's pages instead.
#ifndef GCOMP_BASE_MAPPED_FILE_H_
#define GCOMP_BASE_MAPPED_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gcomp {

class MappedFile {
 public:
  // NotFound naming the file (and why) if it cannot be opened, DataLoss if it cannot be
  // read. Files that cannot be mapped (pipes, /proc, empty files) are read into memory
  // instead. A file truncated by another process while mapped makes later reads of the
  // lost pages fault (SIGBUS): use it for inputs nobody rewrites in place.
  static absl::StatusOr<MappedFile> Open(const std::string& path);

  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  absl::string_view bytes() const;

 private:
  MappedFile() = default;
  void Unmap();

  void* map_ = nullptr;
  size_t size_ = 0;
  std::string read_;  // the bytes when the file was read instead of mapped
};

}  // namespace gcomp

#endif  // GCOMP_BASE_MAPPED_FILE_H_
