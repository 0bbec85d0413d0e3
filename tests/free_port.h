// A loopback port nothing listens on right now, for tests that start gRPC servers at known
// addresses (a config lists every shard's address before the shards start).
#ifndef GCOMP_TESTS_FREE_PORT_H_
#define GCOMP_TESTS_FREE_PORT_H_

#include <cstdlib>

#include "base/loopback_port.h"

namespace gcomp::testing {

// base's FreePort: never the same port twice in one process (the kernel may hand a port
// that was bound and closed straight back, and a config of several shards once listed one
// port twice), and below the ephemeral range that outgoing connections take theirs from.
inline int FreePort() {
  const int port = gcomp::FreePort();
  if (port <= 0) std::abort();  // no free loopback port: nothing below can run
  return port;
}

}  // namespace gcomp::testing

#endif  // GCOMP_TESTS_FREE_PORT_H_
