#include "base/loopback_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <set>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(LoopbackPort, PortsAreFreeAndNeverHandedOutTwice) {
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    const int port = FreePort();
    ASSERT_GT(port, 1023);
    EXPECT_TRUE(seen.insert(port).second) << port;
    // Nothing listens there: this process can bind it.
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0) << port;
    close(fd);
  }
}

}  // namespace
}  // namespace gcomp
