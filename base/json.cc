#include "base/json.h"

#include <cstdint>

#include "absl/strings/str_format.h"

namespace gcomp {
namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if it is not one
// (stray continuation, overlong form, surrogate, above U+10FFFF, truncated); *code_point
// gets its value when it is one.
size_t Utf8SequenceLength(absl::string_view s, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b0 = byte(i);
  size_t n;
  uint32_t cp;
  if (b0 < 0x80) {
    *code_point = b0;
    return 1;
  }
  if ((b0 & 0xE0) == 0xC0) {
    n = 2;
    cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    n = 3;
    cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    n = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  *code_point = cp;
  return n;
}

}  // namespace

absl::string_view Utf8Prefix(absl::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s;
  size_t keep = max_bytes;  // back to the first byte of a character
  while (keep > 0 && (static_cast<uint8_t>(s[keep]) & 0xc0) == 0x80) --keep;
  return s.substr(0, keep);
}

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
