// JSON string literals for the hand-written JSON this project prints (log lines, the
// admin tool's --json, summaries): one place that escapes per RFC 8259; and the same care
// for plain text lines a person reads (EscapeForText).
//
//   absl::StrAppend(&out, "{\"msg\":", JsonQuote(message), "}");
//
// Thread-compatible free functions.
#ifndef GCOMP_BASE_JSON_H_
#define GCOMP_BASE_JSON_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace gcomp {

// Appends `s` as a quoted JSON string: `"` and `\` escaped, control characters as \n, \t,
// ... or \u00XX; valid UTF-8 passes through; every byte that is not part of a valid UTF-8
// sequence becomes \ufffd, so the output always parses.
void AppendJsonString(absl::string_view s, std::string* out);

// The same, returned.
std::string JsonQuote(absl::string_view s);

// Whether code point `cp` is one of those that act on a terminal or on the direction of the
// text around it without showing: C0 controls, DEL, C1 controls (U+0080-U+009F, of which
// U+009B starts a terminal command like ESC [), and the bidirectional marks, embeddings,
// overrides and isolates (U+061C, U+200E-U+200F, U+202A-U+202E, U+2066-U+2069). JSON strings
// and EscapeForText write them escaped.
bool IsHiddenControl(uint32_t cp);

// `s` for a line of text a person reads (a log line, a table cell) when a network peer chose
// it: hidden controls escaped (\n, \t, \xNN for the rest of C0 and DEL, \uXXXX above),
// each byte of invalid UTF-8 as \xNN, everything else kept. No newline or terminal command
// survives, so the text cannot forge a line or repaint the screen.
std::string EscapeForText(absl::string_view s);

}  // namespace gcomp

#endif  // GCOMP_BASE_JSON_H_
