#include "server/address_refusals.h"

#include <algorithm>
#include <iterator>
#include <optional>

#include "base/ip_address.h"

namespace gcomp::server {

AddressRefusals::AddressRefusals(absl::Duration first, absl::Duration longest,
                                 const std::vector<std::string>& never_refused)
    : first_(first), longest_(longest) {
  for (const std::string& a : never_refused) {
    if (a == "*") never_refuse_any_ = true;
    // The config is checked when loaded (cluster/cluster_config.cc): no other entries.
    if (std::optional<std::string> ip = CanonicalIpAddress(a)) never_refused_.insert(*ip);
  }
}

bool AddressRefusals::NeverRefused(absl::string_view address) const {
  if (never_refuse_any_) return true;
  if (never_refused_.empty()) return false;
  std::optional<std::string> ip = CanonicalIpAddress(address);
  return ip.has_value() && never_refused_.contains(*ip);
}

void AddressRefusals::Refuse(const std::string& address, absl::Time now) {
  if (NeverRefused(address)) return;
  Address& a = addresses_[address];
  if (a.refused_until > now) return;  // refused already: one offence per refusal
  a.last = a.refused_until + longest_ < now ? first_ : std::min(a.last * 2, longest_);
  a.refused_until = now + a.last;
}

absl::Duration AddressRefusals::RefusedFor(absl::string_view address, absl::Time now) const {
  auto it = addresses_.find(address);
  if (it == addresses_.end() || it->second.refused_until <= now) return absl::ZeroDuration();
  return it->second.refused_until - now;
}

void AddressRefusals::Forget(absl::Time now) {
  for (auto it = addresses_.begin(); it != addresses_.end();) {
    auto next = std::next(it);
    // Kept while refused, or while it would be refused longer next time.
    if (it->second.refused_until + longest_ <= now) addresses_.erase(it);
    it = next;
  }
}

std::string AddressOfPeer(absl::string_view peer) {
  const size_t scheme = peer.find(':');
  const size_t port = peer.rfind(':');
  if (scheme == absl::string_view::npos || port == scheme) return std::string(peer);
  return std::string(peer.substr(scheme + 1, port - scheme - 1));
}

}  // namespace gcomp::server
