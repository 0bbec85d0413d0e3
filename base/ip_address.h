// IP address literals in one spelling, so that a config's "::1" matches a gRPC peer's
// "%5B::1%5D" and its "10.0.0.7" a peer seen as "::ffff:10.0.0.7".
#ifndef GCOMP_BASE_IP_ADDRESS_H_
#define GCOMP_BASE_IP_ADDRESS_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace gcomp {

// The canonical text of an IPv4 or IPv6 literal ("10.0.0.7", "::1"), given bare, in
// brackets, or with gRPC's percent-encoded brackets; an IPv4-mapped IPv6 address is given
// as IPv4. nullopt when `text` is no IP literal (a host name, a unix path).
std::optional<std::string> CanonicalIpAddress(absl::string_view text);

}  // namespace gcomp

#endif  // GCOMP_BASE_IP_ADDRESS_H_
