// Whole-file reads and crash-safe writes.
#ifndef GCOMP_BASE_FILES_H_
#define GCOMP_BASE_FILES_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gcomp {

// The bytes of the file at `path`; NotFound naming it if there is no such file, the code of
// the errno otherwise (PermissionDenied, ...) if it cannot be opened, DataLoss if reading
// fails (a directory, an I/O error).
absl::StatusOr<std::string> ReadFile(const std::string& path);
// The same, refusing with FailedPrecondition naming the limit a file of more than
// `max_bytes`: a regular file by its size before anything is read, anything else (a
// device such as /dev/zero, a pipe) once more than that has been read. ResourceExhausted
// where memory for the bytes cannot be had.
absl::StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes);
// The most read whole from a pipe or device, whose size is not known before: a path at
// /dev/zero is refused after this much instead of read until memory runs out.
inline constexpr uint64_t kMaxUnsizedReadBytes = uint64_t{1} << 30;

// How far a crash-safe write goes (WriteFileAtomically, AtomicFileWriter).
struct AtomicWriteOptions {
  // Off: once the write returns, every process reads the new content, and a crash of the
  // writing process leaves `path` old or new, never half-written; a crash of the machine
  // (power, kernel) may still lose the new content, or leave the old one. On: the file is
  // flushed to the device (fsync) before the rename and its directory after it (best
  // effort: a directory that cannot be opened is not synced), so what the write returned
  // also survives a crash of the machine. Costs a device flush or two per file.
  bool fsync = false;
};

// Writes `bytes` to a temporary file beside `path` and renames it over `path`, so `path`
// is never left half-written: it holds either its old content or all of `bytes`. Errors
// are those of AtomicFileWriter's Create, Append and Commit.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const AtomicWriteOptions& options = {});
// The same for a file made of several pieces, written in order without joining them first.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::Span<const absl::string_view> parts,
                                 const AtomicWriteOptions& options = {});

// Writes a file piece by piece through a temporary file beside `path`, which Commit()
// renames over `path`. Destroyed without a successful Commit() (an error on the way), it
// removes the temporary file and `path` keeps its old content.
class AtomicFileWriter {
 public:
  // PermissionDenied naming the temporary file if it cannot be created; FailedPrecondition
  // if `path` exists and is not a regular file (a device, pipe or directory).
  static absl::StatusOr<AtomicFileWriter> Create(const std::string& path,
                                                 const AtomicWriteOptions& options = {});

  AtomicFileWriter(AtomicFileWriter&& other) noexcept;
  AtomicFileWriter& operator=(AtomicFileWriter&& other) = delete;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;
  ~AtomicFileWriter();

  // DataLoss naming the temporary file if the bytes cannot be written.
  absl::Status Append(absl::string_view bytes);
  // Overwrites bytes already appended, from `offset` on (a header whose fields are known
  // only at the end); OutOfRange if they would reach past what was appended.
  absl::Status WriteAt(uint64_t offset, absl::string_view bytes);
  // Closes and renames (with options.fsync, syncs the file first and the directory after);
  // PermissionDenied if the rename fails, DataLoss if the sync or the close does.
  absl::Status Commit();

 private:
  AtomicFileWriter(std::string path, std::string tmp, int fd, const AtomicWriteOptions& options)
      : path_(std::move(path)), tmp_(std::move(tmp)), fd_(fd), options_(options) {}
  void Abandon();
  // Writes `bytes` at `offset`; DataLoss (and abandons the file) if that fails.
  absl::Status Pwrite(uint64_t offset, absl::string_view bytes);

  std::string path_;
  std::string tmp_;
  int fd_ = -1;        // -1 once committed or abandoned
  uint64_t size_ = 0;  // bytes appended
  AtomicWriteOptions options_;
};

}  // namespace gcomp

#endif  // GCOMP_BASE_FILES_H_
