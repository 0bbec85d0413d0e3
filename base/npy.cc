#include "base/npy.h"

#include <sys/stat.h>

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "base/system_memory.h"
#include "format/endian.h"

namespace gcomp {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMaxElements = size_t{1} << 34;

// The value text after `'key':` in the header dict, up to the next top-level comma.
absl::StatusOr<absl::string_view> DictValue(absl::string_view dict, absl::string_view key) {
  const std::string quoted = absl::StrCat("'", key, "'");
  size_t at = dict.find(quoted);
  if (at == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("npy header has no '", key, "' entry"));
  }
  // Python's own reader keeps the last of repeated keys; a header with two is refused
  // rather than read another way.
  const std::string double_quoted = absl::StrCat("\"", key, "\"");
  if (dict.find(quoted, at + quoted.size()) != absl::string_view::npos ||
      dict.find(double_quoted) != absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat("npy header gives '", key, "' twice"));
  }
  absl::string_view rest = dict.substr(at + quoted.size());
  rest = absl::StripLeadingAsciiWhitespace(rest);
  if (!absl::ConsumePrefix(&rest, ":")) {
    return absl::InvalidArgumentError("npy header: malformed dict");
  }
  rest = absl::StripLeadingAsciiWhitespace(rest);
  size_t end = 0;
  int depth = 0;
  for (; end < rest.size(); ++end) {
    char c = rest[end];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' || c == '}') && depth == 0) break;
  }
  return absl::StripTrailingAsciiWhitespace(rest.substr(0, end));
}

}  // namespace

absl::StatusOr<NpyF32View> ParseNpyF32View(absl::string_view bytes) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != absl::string_view(kMagic, 6)) {
    return absl::InvalidArgumentError("not a .npy file (bad magic)");
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_len, offset;
  if (major == 1) {
    header_len = format::LoadLE16(reinterpret_cast<const uint8_t*>(bytes.data() + 8));
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return absl::InvalidArgumentError(".npy file truncated in its header");
    header_len = format::LoadLE32(reinterpret_cast<const uint8_t*>(bytes.data() + 8));
    offset = 12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unsupported .npy version ", major));
  }
  if (bytes.size() < offset + header_len) {
    return absl::InvalidArgumentError(".npy file truncated in its header");
  }
  const absl::string_view dict = bytes.substr(offset, header_len);
  absl::StatusOr<absl::string_view> descr = DictValue(dict, "descr");
  if (!descr.ok()) return descr.status();
  if (*descr != "'<f4'" && *descr != "'=f4'") {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported .npy dtype ", *descr, " (want little-endian float32 '<f4')"));
  }
  absl::StatusOr<absl::string_view> fortran = DictValue(dict, "fortran_order");
  if (!fortran.ok()) return fortran.status();
  if (*fortran != "False") {
    return absl::InvalidArgumentError(".npy array is in Fortran order (want C order)");
  }
  absl::StatusOr<absl::string_view> shape_text = DictValue(dict, "shape");
  if (!shape_text.ok()) return shape_text.status();
  absl::string_view s = *shape_text;
  if (!absl::ConsumePrefix(&s, "(") || !absl::ConsumeSuffix(&s, ")")) {
    return absl::InvalidArgumentError(absl::StrCat("npy header: bad shape ", *shape_text));
  }
  NpyF32View view;
  size_t count = 1;
  for (absl::string_view dim : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    uint64_t d;
    if (!absl::SimpleAtoi(dim, &d) || d > kMaxElements) {
      return absl::InvalidArgumentError(absl::StrCat("npy header: bad shape ", *shape_text));
    }
    view.shape.push_back(d);
    // Checked before multiplying: dimensions of up to 2^34 each could wrap 64 bits.
    if (d != 0 && count > kMaxElements / d) {
      return absl::InvalidArgumentError(
          absl::StrCat(".npy array too large: shape ", *shape_text, " has over 2^34 elements"));
    }
    count *= d;
  }
  const size_t data_bytes = bytes.size() - offset - header_len;
  if (data_bytes != count * 4) {
    return absl::InvalidArgumentError(absl::StrCat(".npy data is ", data_bytes,
                                                   " bytes but the shape needs ", count * 4,
                                                   data_bytes < count * 4 ? " (truncated)" : ""));
  }
  view.data = bytes.substr(offset + header_len);
  return view;
}

absl::StatusOr<NpyArray> ParseNpyF32(absl::string_view bytes) {
  absl::StatusOr<NpyF32View> view = ParseNpyF32View(bytes);
  if (!view.ok()) return view.status();
  NpyArray array;
  array.shape = std::move(view->shape);
  array.data.resize(view->data.size() / 4);
  if (!view->data.empty()) std::memcpy(array.data.data(), view->data.data(), view->data.size());
  return array;
}

absl::StatusOr<NpyArray> ReadNpyF32(const std::string& path) {
  struct stat st;
  const bool regular = stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
  absl::StatusOr<std::string> bytes =
      // A regular file larger than half the memory this process may have would only run out
      // of it (the array is copied again below).
      ReadFile(path, regular ? AvailableMemoryBytes() / 2 : kMaxUnsizedReadBytes);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<NpyArray> array = ParseNpyF32(*bytes);
  if (!array.ok()) {
    return absl::Status(array.status().code(), absl::StrCat(path, ": ", array.status().message()));
  }
  return array;
}

std::string NpyF32Header(absl::Span<const size_t> shape) {
  std::string dims = absl::StrJoin(shape, ", ");
  if (shape.size() == 1) dims += ",";
  std::string dict =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  // Pad so that the data starts on a 64-byte boundary; the header ends with '\n'.
  size_t total = 10 + dict.size() + 1;
  dict.append((64 - total % 64) % 64, ' ');
  dict.push_back('\n');
  std::string out(kMagic, 6);
  out.push_back(1);
  out.push_back(0);
  uint8_t len[2];
  format::StoreLE16(len, static_cast<uint16_t>(dict.size()));
  out.append(reinterpret_cast<const char*>(len), sizeof(len));
  out += dict;
  return out;
}

std::string SerializeNpyF32(absl::Span<const float> data, absl::Span<const size_t> shape) {
  std::string out = NpyF32Header(shape);
  out.append(reinterpret_cast<const char*>(data.data()), data.size() * 4);
  return out;
}

absl::Status WriteNpyF32(const std::string& path, absl::Span<const float> data,
                         absl::Span<const size_t> shape) {
  const std::string header = NpyF32Header(shape);
  const absl::string_view parts[] = {
      header, absl::string_view(reinterpret_cast<const char*>(data.data()), data.size() * 4)};
  return WriteFileAtomically(path, parts);
}

}  // namespace gcomp
