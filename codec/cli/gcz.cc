#include "codec/cli/gcz.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace gcomp::cli {
namespace {
constexpr char kMagic[4] = {'G', 'C', 'Z', '1'};
constexpr uint8_t kVersion = 1;
}  // namespace

void AppendGczHeader(const GczHeader& header, std::string* out) {
  out->append(kMagic, 4);
  out->push_back(static_cast<char>(kVersion));
  out->push_back(static_cast<char>(header.dtype));
  out->push_back(static_cast<char>(header.shape.size()));
  out->push_back(0);
  for (uint64_t d : header.shape) {
    char bytes[8];
    std::memcpy(bytes, &d, 8);
    out->append(bytes, 8);
  }
}

absl::StatusOr<GczHeader> ParseGcz(absl::string_view file, absl::string_view* frame) {
  if (file.size() < 8 || std::memcmp(file.data(), kMagic, 4) != 0) {
    return absl::InvalidArgumentError("not a .gcz file (bad magic)");
  }
  if (static_cast<uint8_t>(file[4]) != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported .gcz version ", static_cast<uint8_t>(file[4])));
  }
  GczHeader header;
  const uint8_t dtype = static_cast<uint8_t>(file[5]);
  if (dtype < 1 || dtype > 3) return absl::DataLossError("bad dtype in .gcz header");
  header.dtype = static_cast<codec::DType>(dtype);
  const size_t ndim = static_cast<uint8_t>(file[6]);
  if (ndim > kMaxGczDims || file[7] != 0) return absl::DataLossError("bad .gcz header");
  if (file.size() < 8 + 8 * ndim) return absl::DataLossError(".gcz file truncated in its header");
  for (size_t i = 0; i < ndim; ++i) {
    uint64_t d;
    std::memcpy(&d, file.data() + 8 + 8 * i, 8);
    header.shape.push_back(d);
  }
  *frame = file.substr(8 + 8 * ndim);
  return header;
}

}  // namespace gcomp::cli
