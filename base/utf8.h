// UTF-8 as RFC 3629 defines it (shortest forms only, no surrogates, nothing above U+10FFFF):
// the one place that decides whether bytes are valid text and where a character ends. Text
// a peer sends lands in proto3 string fields, JSON and log lines, which all need it.
//
// Thread-compatible free functions.
#ifndef GCOMP_BASE_UTF8_H_
#define GCOMP_BASE_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace gcomp {

// Length (1..4) of the valid UTF-8 sequence that starts at s[i], or 0 where none does (a
// stray continuation byte, an overlong form, a surrogate, a code point above U+10FFFF, a
// sequence cut short by the end of `s`); *code_point gets its value when there is one.
// Requires i < s.size().
size_t Utf8SequenceLength(absl::string_view s, size_t i, uint32_t* code_point);

// Appends the UTF-8 form of `code_point` to *out (for text decoded from \uXXXX escapes);
// false, appending nothing, for a surrogate or a value above U+10FFFF, which have none.
bool AppendUtf8(uint32_t code_point, std::string* out);

// Whether all of `s` is valid UTF-8.
bool IsValidUtf8(absl::string_view s);

// The longest prefix of `s` of at most `max_bytes` that does not end inside a UTF-8
// character (for cutting text a peer sent to a size). It only looks at the cut: invalid
// bytes before it stay.
absl::string_view Utf8Prefix(absl::string_view s, size_t max_bytes);

}  // namespace gcomp

#endif  // GCOMP_BASE_UTF8_H_
