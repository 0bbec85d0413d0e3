#include "base/ip_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>

#include "absl/strings/match.h"

namespace gcomp {

std::optional<std::string> CanonicalIpAddress(absl::string_view text) {
  if (absl::StartsWithIgnoreCase(text, "%5B") && absl::EndsWithIgnoreCase(text, "%5D")) {
    text = text.substr(3, text.size() - 6);
  } else if (absl::StartsWith(text, "[") && absl::EndsWith(text, "]")) {
    text = text.substr(1, text.size() - 2);
  }
  if (text.empty() || text.size() >= INET6_ADDRSTRLEN) return std::nullopt;
  const std::string s(text);
  char out[INET6_ADDRSTRLEN];
  in_addr v4;
  if (inet_pton(AF_INET, s.c_str(), &v4) == 1) {
    return std::string(inet_ntop(AF_INET, &v4, out, sizeof(out)));
  }
  in6_addr v6;
  if (inet_pton(AF_INET6, s.c_str(), &v6) != 1) return std::nullopt;
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(&v4, &v6.s6_addr[12], sizeof(v4));
    return std::string(inet_ntop(AF_INET, &v4, out, sizeof(out)));
  }
  return std::string(inet_ntop(AF_INET6, &v6, out, sizeof(out)));
}

}  // namespace gcomp
