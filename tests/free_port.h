// A loopback port nothing listens on right now, for tests that start gRPC servers at known
// addresses (a config lists every shard's address before the shards start).
#ifndef GCOMP_TESTS_FREE_PORT_H_
#define GCOMP_TESTS_FREE_PORT_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

namespace gcomp::testing {

inline int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::abort();  // the test machine has no loopback: nothing below can run
  }
  close(fd);
  return ntohs(a.sin_port);
}

}  // namespace gcomp::testing

#endif  // GCOMP_TESTS_FREE_PORT_H_
