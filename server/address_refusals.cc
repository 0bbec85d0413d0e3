#include "server/address_refusals.h"

#include <algorithm>
#include <iterator>

namespace gcomp::server {

void AddressRefusals::Refuse(const std::string& address, absl::Time now) {
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
