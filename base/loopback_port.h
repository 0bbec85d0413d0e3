// Free loopback ports for processes a program starts at addresses it must name first (the
// local launcher's shards, the etcd members of the launcher and of tests).
#ifndef GCOMP_BASE_LOOPBACK_PORT_H_
#define GCOMP_BASE_LOOPBACK_PORT_H_

namespace gcomp {

// A loopback port nothing listens on, below the kernel's ephemeral range: the outgoing
// connections of the workers and shards take their local ports from that range, and one
// could take a killed process's port before it restarts on it. -1 if none is found.
int UnusedPort();

// A free loopback port this process has not handed out before: the kernel may give the
// same free port to two probes in a row, and e.g. a shard's gRPC and metrics ports must
// differ. Thread-safe.
int FreePort();

}  // namespace gcomp

#endif  // GCOMP_BASE_LOOPBACK_PORT_H_
