#include "base/json.h"

#include <cstdint>

#include "absl/strings/str_format.h"
#include "base/utf8.h"

namespace gcomp {

bool IsHiddenControl(uint32_t cp) {
  return cp < 0x20 || (cp >= 0x7F && cp <= 0x9F) || cp == 0x061C || cp == 0x200E || cp == 0x200F ||
         (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069);
}

std::string EscapeForText(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    const size_t n = Utf8SequenceLength(s, i, &cp);
    if (n == 0) {
      absl::StrAppendFormat(&out, "\\x%02x", static_cast<uint8_t>(s[i]));
      ++i;
      continue;
    }
    if (!IsHiddenControl(cp)) {
      out.append(s.data() + i, n);
    } else if (cp == '\n') {
      out.append("\\n");
    } else if (cp == '\t') {
      out.append("\\t");
    } else if (cp < 0x80) {
      absl::StrAppendFormat(&out, "\\x%02x", cp);
    } else {
      absl::StrAppendFormat(&out, "\\u%04x", cp);
    }
    i += n;
  }
  return out;
}

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    switch (c) {
      case '"': out->append("\\\""); ++i; continue;
      case '\\': out->append("\\\\"); ++i; continue;
      case '\n': out->append("\\n"); ++i; continue;
      case '\r': out->append("\\r"); ++i; continue;
      case '\t': out->append("\\t"); ++i; continue;
      case '\b': out->append("\\b"); ++i; continue;
      case '\f': out->append("\\f"); ++i; continue;
      default: break;
    }
    if (c < 0x20 || c == 0x7F) {
      // DEL is legal JSON but unreadable in a terminal or log viewer.
      absl::StrAppendFormat(out, "\\u%04x", c);
      ++i;
      continue;
    }
    uint32_t cp = 0;
    const size_t n = Utf8SequenceLength(s, i, &cp);
    if (n == 0) {
      out->append("\\ufffd");
      ++i;
      continue;
    }
    if (IsHiddenControl(cp)) {
      absl::StrAppendFormat(out, "\\u%04x", cp);
    } else {
      out->append(s.data() + i, n);
    }
    i += n;
  }
  out->push_back('"');
}

std::string JsonQuote(absl::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  AppendJsonString(s, &out);
  return out;
}

}  // namespace gcomp
