// Reading and writing float32 .npy files (NumPy format versions 1-3, little-endian '<f4',
// C order). Errors name the file and what is wrong with it.
#ifndef GCOMP_BASE_NPY_H_
#define GCOMP_BASE_NPY_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace gcomp {

struct NpyArray {
  std::vector<size_t> shape;  // empty for a 0-d array (one element)
  std::vector<float> data;    // C order
};

// A parsed .npy file whose data still lies in the bytes it was parsed from (no copy).
struct NpyF32View {
  std::vector<size_t> shape;  // empty for a 0-d array (one element)
  absl::string_view data;     // little-endian float32 in C order, 4 bytes per element
};

// Parses the bytes of a .npy file. InvalidArgument for anything but a C-order '<f4' array.
absl::StatusOr<NpyArray> ParseNpyF32(absl::string_view bytes);
// The same checks; the view points into `bytes`, which must outlive it.
absl::StatusOr<NpyF32View> ParseNpyF32View(absl::string_view bytes);
// Reads and parses a file; NotFound if it cannot be opened.
absl::StatusOr<NpyArray> ReadNpyF32(const std::string& path);

// The header of a version 1.0 .npy file of float32 data of that shape; the data, written
// right after it, starts 64-byte aligned.
std::string NpyF32Header(absl::Span<const size_t> shape);
// The bytes of a version 1.0 .npy file. Requires the product of `shape` to be data.size().
std::string SerializeNpyF32(absl::Span<const float> data, absl::Span<const size_t> shape);
// Writes a .npy file through a temporary file in the same directory and a rename, so `path`
// is never left half-written.
absl::Status WriteNpyF32(const std::string& path, absl::Span<const float> data,
                         absl::Span<const size_t> shape);

}  // namespace gcomp

#endif  // GCOMP_BASE_NPY_H_
