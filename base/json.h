// JSON string literals for the hand-written JSON this project prints (log lines, the
// admin tool's --json, summaries): one place that escapes per RFC 8259.
//
//   absl::StrAppend(&out, "{\"msg\":", JsonQuote(message), "}");
//
// Thread-compatible free functions.
#ifndef GCOMP_BASE_JSON_H_
#define GCOMP_BASE_JSON_H_

#include <string>

#include "absl/strings/string_view.h"

namespace gcomp {

// Appends `s` as a quoted JSON string: `"` and `\` escaped, control characters as \n, \t,
// ... or \u00XX; valid UTF-8 passes through; every byte that is not part of a valid UTF-8
// sequence becomes \ufffd, so the output always parses.
void AppendJsonString(absl::string_view s, std::string* out);

// The same, returned.
std::string JsonQuote(absl::string_view s);

}  // namespace gcomp

#endif  // GCOMP_BASE_JSON_H_
