// The guard's own pieces; tests/hostile_client_test (APeerOverTheStreamCapIsClosed) has a
// shard close a real peer over the cap.
#include "server/stream_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

// A loopback TCP connection: [0] the accepted (server) side, [1] the client side.
struct Connection {
  int fds[2] = {-1, -1};
  int port = 0;
  Connection() {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
        listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      return;
    }
    port = ntohs(a.sin_port);
    fds[1] = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fds[1], reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return;
    fds[0] = accept(listener, nullptr, nullptr);
    close(listener);
  }
  ~Connection() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
};

TEST(StreamGuardTest, PeerOfSocketNamesThePeerAsGrpcDoes) {
  Connection c;
  ASSERT_GE(c.fds[0], 0);
  std::string peer;
  int local_port = 0;
  ASSERT_TRUE(PeerOfSocket(c.fds[0], &peer, &local_port));
  EXPECT_EQ(local_port, c.port);
  sockaddr_in client{};
  socklen_t len = sizeof(client);
  ASSERT_EQ(getsockname(c.fds[1], reinterpret_cast<sockaddr*>(&client), &len), 0);
  EXPECT_EQ(peer, absl::StrCat("ipv4:127.0.0.1:", ntohs(client.sin_port)));
  EXPECT_FALSE(PeerOfSocket(-1, &peer, &local_port));
}

// Connections gRPC does not know (here: none at all) are never touched; closed ones are
// forgotten.
TEST(StreamGuardTest, ASweepLeavesConnectionsWithinTheirCapAlone) {
  StreamGuard guard(StreamGuard::Options{});
  Connection c;
  ASSERT_GE(c.fds[0], 0);
  EXPECT_TRUE(guard.Admit(c.fds[0]).ok());  // no address refused yet
  guard.Track(c.fds[0], 0);
  EXPECT_EQ(guard.Sweep(), 0u);
  EXPECT_EQ(guard.closed(), 0u);
  EXPECT_EQ(guard.refused(), 0u);
  // Still open: a byte goes through.
  ASSERT_EQ(send(c.fds[1], "x", 1, 0), 1);
  char b = 0;
  EXPECT_EQ(recv(c.fds[0], &b, 1, 0), 1);
  guard.Start();  // and stops with the guard
}

}  // namespace
}  // namespace gcomp::server
