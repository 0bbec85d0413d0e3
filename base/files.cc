#include "base/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"

namespace gcomp {
namespace {

// Makes the directory entry of `path` (a rename into it) durable; best effort.
void SyncDirectoryOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  std::string dir = ".";
  if (slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

}  // namespace

absl::StatusOr<std::string> ReadFile(const std::string& path) { return ReadFile(path, UINT64_MAX); }

absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    // NotFound only where there is no such file: a file that is there but cannot be opened
    // (no permission, a symlink loop) is not to be taken for one never written.
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot open ", path));
  }
  const auto too_large = [&] {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is larger than ", max_bytes, " bytes, the most it may hold"));
  };
  // A regular file is read into a buffer of its size (+1 to see the end in the same loop):
  // one allocation and a read call or two, where a stream grows a buffer by doubling and
  // reads 8 KB at a time. Files of unknown size (pipes, /proc) grow from 64 KiB.
  struct stat st;
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular && static_cast<uint64_t>(st.st_size) > max_bytes) {
    close(fd);
    return too_large();
  }
  std::string bytes;
  // Allocation failures become a status here, not an exception through every caller.
  const auto grow = [&](size_t want) {
    try {
      bytes.resize(want);
      return absl::OkStatus();
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot read ", path, ": no memory for ", want, " bytes"));
    }
  };
  absl::Status status = grow(regular ? static_cast<size_t>(st.st_size) + 1 : size_t{64} << 10);
  size_t size = 0;
  while (status.ok() && size <= max_bytes) {  // past it: a device, a pipe, a file that grew
    if (size == bytes.size() && !(status = grow(bytes.size() * 2)).ok()) break;
    const ssize_t n = read(fd, bytes.data() + size, bytes.size() - size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      status = absl::DataLossError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
      break;
    }
    if (n == 0) break;
    size += static_cast<size_t>(n);
  }
  close(fd);
  if (!status.ok()) return status;
  if (size > max_bytes) return too_large();
  bytes.resize(size);
  return bytes;
}

absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const AtomicWriteOptions& options) {
  const absl::string_view parts[] = {bytes};
  return WriteFileAtomically(path, parts, options);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts,
                                 const AtomicWriteOptions& options) {
  absl::StatusOr<AtomicFileWriter> writer = AtomicFileWriter::Create(path, options);
  if (!writer.ok()) return writer.status();
  for (absl::string_view part : parts) {
    if (absl::Status s = writer->Append(part); !s.ok()) return s;
  }
  return writer->Commit();
}

absl::StatusOr<AtomicFileWriter> AtomicFileWriter::Create(const std::string& path,
                                                          const AtomicWriteOptions& options) {
  // The commit renames over `path`: right for a file, wrong for a device or a pipe (as root,
  // /dev/null itself would become a file).
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path,
                     " exists and is not a regular file (a directory, device or pipe); refusing to "
                     "replace it"));
  }
  std::string tmp = absl::StrCat(path, ".tmp", getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create ", tmp, ": ", std::strerror(errno)));
  }
  return AtomicFileWriter(path, std::move(tmp), fd, options);
}

AtomicFileWriter::AtomicFileWriter(AtomicFileWriter&& other) noexcept
    : path_(std::move(other.path_)),
      tmp_(std::move(other.tmp_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      options_(other.options_) {}

AtomicFileWriter::~AtomicFileWriter() { Abandon(); }

void AtomicFileWriter::Abandon() {
  if (fd_ < 0) return;
  close(fd_);
  fd_ = -1;
  std::remove(tmp_.c_str());
}

absl::Status AtomicFileWriter::Append(absl::string_view bytes) {
  if (absl::Status st = Pwrite(size_, bytes); !st.ok()) return st;
  size_ += bytes.size();
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::WriteAt(uint64_t offset, absl::string_view bytes) {
  if (fd_ >= 0 && (offset > size_ || bytes.size() > size_ - offset)) {
    return absl::OutOfRangeError(absl::StrCat("cannot overwrite ", bytes.size(), " bytes at ",
                                              offset, " of ", tmp_, ": it holds ", size_));
  }
  return Pwrite(offset, bytes);
}

absl::Status AtomicFileWriter::Pwrite(uint64_t offset, absl::string_view bytes) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(tmp_, " is closed"));
  while (!bytes.empty()) {
    const ssize_t n = pwrite(fd_, bytes.data(), bytes.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      Abandon();
      return absl::DataLossError(absl::StrCat("cannot write ", tmp_, ": ", std::strerror(err)));
    }
    bytes.remove_prefix(static_cast<size_t>(n));
    offset += static_cast<uint64_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AtomicFileWriter::Commit() {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(tmp_, " is closed"));
  const int fd = std::exchange(fd_, -1);
  if (options_.fsync && fsync(fd) != 0) {
    const int err = errno;
    close(fd);
    std::remove(tmp_.c_str());
    return absl::DataLossError(absl::StrCat("cannot sync ", tmp_, ": ", std::strerror(err)));
  }
  if (close(fd) != 0) {
    const int err = errno;
    std::remove(tmp_.c_str());
    return absl::DataLossError(absl::StrCat("cannot write ", tmp_, ": ", std::strerror(err)));
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_.c_str());
    return absl::PermissionDeniedError(
        absl::StrCat("cannot rename ", tmp_, " to ", path_, ": ", std::strerror(err)));
  }
  if (options_.fsync) SyncDirectoryOf(path_);
  return absl::OkStatus();
}

}  // namespace gcomp
