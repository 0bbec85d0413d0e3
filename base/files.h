// Whole-file reads and crash-safe writes.
#ifndef GCOMP_BASE_FILES_H_
#define GCOMP_BASE_FILES_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace gcomp {

// The bytes of the file at `path`; NotFound naming it if it cannot be opened.
absl::StatusOr<std::string> ReadFile(const std::string& path);

// Writes `bytes` to a temporary file beside `path` and renames it over `path`, so `path`
// is never left half-written: it holds either its old content or all of `bytes`.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes);

}  // namespace gcomp

#endif  // GCOMP_BASE_FILES_H_
