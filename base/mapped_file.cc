#include "base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/files.h"

namespace gcomp {

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0;
  void* map = regular ? mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ,
                             MAP_PRIVATE | MAP_POPULATE, fd, 0)
                      : MAP_FAILED;
  close(fd);  // the mapping keeps the file
  MappedFile file;
  if (map != MAP_FAILED) {
    file.map_ = map;
    file.size_ = static_cast<size_t>(st.st_size);
    return file;
  }
  absl::StatusOr<std::string> bytes = ReadFile(path);
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

absl::string_view MappedFile::bytes() const {
  if (map_ != nullptr) return absl::string_view(static_cast<const char*>(map_), size_);
  return read_;
}

}  // namespace gcomp
