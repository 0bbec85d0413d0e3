// The .gcz file: a small header (magic, version, dtype, shape) followed by one codec frame.
// docs/FORMAT.md specifies it.
#ifndef GCOMP_CODEC_CLI_GCZ_H_
#define GCOMP_CODEC_CLI_GCZ_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "codec/codec.h"

namespace gcomp::cli {

// The most dimensions a .gcz header holds.
inline constexpr size_t kMaxGczDims = 8;

struct GczHeader {
  codec::DType dtype = codec::DType::kF32;
  std::vector<uint64_t> shape;  // at most kMaxGczDims dims; product = element count
};

// Appends the file header to *out (the frame follows it).
void AppendGczHeader(const GczHeader& header, std::string* out);

// Splits a .gcz file into its header and frame bytes (a view into `file`); DataLoss or
// InvalidArgument for anything malformed.
absl::StatusOr<GczHeader> ParseGcz(absl::string_view file, absl::string_view* frame);

}  // namespace gcomp::cli

#endif  // GCOMP_CODEC_CLI_GCZ_H_
