// Which client addresses a shard refuses for now, and for how long.
//
// An address's first offence refuses it for `first`; each further offence while the last
// is remembered refuses it twice as long as the time before, up to `longest`. An address
// without an offence for `longest` after its refusal ended starts over at `first`. Offences
// while it is refused already do not count: several at once (all of one peer's replies, all
// of its connections) are one. Used by UnreadReplies (calls) and StreamGuard (connections).
// Addresses listed as never refused (the config's `limits.never_refused`: a NAT, a mesh
// sidecar, a local job, where honest clients share the offender's address) are not; their
// offending connection or call is still ended by the owner. Not thread-safe: its owner's
// lock guards it.
#ifndef GCOMP_SERVER_ADDRESS_REFUSALS_H_
#define GCOMP_SERVER_ADDRESS_REFUSALS_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gcomp::server {

class AddressRefusals {
 public:
  // `never_refused`: IP literals in any spelling (see CanonicalIpAddress), or "*" for all.
  AddressRefusals(absl::Duration first, absl::Duration longest,
                  const std::vector<std::string>& never_refused = {});

  // An offence of `address` at `now` (none for a never-refused address).
  void Refuse(const std::string& address, absl::Time now);
  bool NeverRefused(absl::string_view address) const;
  // How much longer than `now` `address` is refused; zero where it is not.
  absl::Duration RefusedFor(absl::string_view address, absl::Time now) const;
  // Forgets the addresses neither refused nor remembered for the doubling as of `now`.
  void Forget(absl::Time now);
  size_t size() const { return addresses_.size(); }

 private:
  struct Address {
    absl::Time refused_until = absl::InfinitePast();
    absl::Duration last;  // the last refusal's length
  };
  const absl::Duration first_;
  const absl::Duration longest_;
  bool never_refuse_any_ = false;
  absl::flat_hash_set<std::string> never_refused_;  // canonical IP literals
  absl::flat_hash_map<std::string, Address> addresses_;
};

// The host of a gRPC peer string: "10.0.0.7" of "ipv4:10.0.0.7:51234", "%5B::1%5D" of
// "ipv6:%5B::1%5D:51234" (gRPC percent-encodes the brackets); anything without a port as
// it is.
std::string AddressOfPeer(absl::string_view peer);

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_ADDRESS_REFUSALS_H_
