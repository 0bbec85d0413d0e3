#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"

namespace gcomp {

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path,
                                            const MappedFileOptions& options) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
  void* map = regular ? mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                             MAP_PRIVATE | (options.populate ? MAP_POPULATE : 0), fd, 0)
                      : MAP_FAILED;
  close(fd);  // the mapping keeps the file
  MappedFile file;
  if (map != MAP_FAILED) {
    file.map_ = map;
    file.size_ = static_cast<size_t>(st.st_size);
    return file;
  }
  absl::StatusOr<std::string> bytes = ReadFile(path, options.max_unmapped_bytes);
  if (!bytes.ok()) return bytes.status();
  file.read_ = *std::move(bytes);
  return file;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      read_(std::move(other.read_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    read_ = std::move(other.read_);
  }
  return *this;
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  if (map_ != nullptr) munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

// The pages of [offset, offset + size) within the mapping, widened (inward = false) or
// narrowed (inward = true) to page boundaries; empty when nothing is left.
std::pair<char*, size_t> MappedFile::PageRange(size_t offset, size_t size, bool inward) const {
  if (map_ == nullptr || offset >= size_) return {nullptr, 0};
  size = std::min(size, size_ - offset);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size_t lo = offset, hi = offset + size;
  if (inward) {
    lo = (lo + page - 1) / page * page;
    // The mapping's last page counts as whole: nothing else lives in it.
    hi = hi == size_ ? (hi + page - 1) / page * page : hi / page * page;
  } else {
    lo = lo / page * page;
    hi = (hi + page - 1) / page * page;
  }
  if (hi <= lo) return {nullptr, 0};
  return {static_cast<char*>(map_) + lo, hi - lo};
}

void MappedFile::Prefetch(size_t offset, size_t size) const {
  const auto [p, len] = PageRange(offset, size, /*inward=*/false);
  if (len == 0) return;
#ifdef MADV_POPULATE_READ
  if (madvise(p, len, MADV_POPULATE_READ) == 0) return;
#endif
  madvise(p, len, MADV_WILLNEED);  // a hint: failure only costs speed
}

void MappedFile::Release(size_t offset, size_t size) const {
  const auto [p, len] = PageRange(offset, size, /*inward=*/true);
  // A read-only private mapping of a file holds no data of its own: dropping its pages
  // only unmaps them.
  if (len != 0) madvise(p, len, MADV_DONTNEED);
}

absl::string_view MappedFile::bytes() const {
  if (map_ != nullptr) return absl::string_view(static_cast<const char*>(map_), size_);
  return read_;
}

}  // namespace gcomp
