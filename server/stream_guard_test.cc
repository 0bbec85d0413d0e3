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

// A loopback TCP connection: [0] the accepted (server) side, [1] the client side. The
// listener is IPv4 (127.0.0.1) or IPv6 ([::], dual-stack); the client connects to
// `client_to` (127.0.0.1 or ::1).
struct Connection {
  int fds[2] = {-1, -1};
  int port = 0;
  Connection() : Connection(false, "127.0.0.1") {}
  Connection(bool ipv6_listener, const char* client_to) {
    sockaddr_storage a{};
    socklen_t len;
    int listener;
    if (ipv6_listener) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&a);
      a6->sin6_family = AF_INET6;
      a6->sin6_addr = in6addr_any;
      listener = socket(AF_INET6, SOCK_STREAM, 0);
      const int off = 0;
      setsockopt(listener, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof(off));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&a);
      a4->sin_family = AF_INET;
      a4->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      listener = socket(AF_INET, SOCK_STREAM, 0);
      len = sizeof(sockaddr_in);
    }
    if (bind(listener, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      close(listener);
      return;
    }
    port = ntohs(ipv6_listener ? reinterpret_cast<sockaddr_in6*>(&a)->sin6_port
                               : reinterpret_cast<sockaddr_in*>(&a)->sin_port);
    sockaddr_storage to{};
    socklen_t to_len;
    if (std::string(client_to).find(':') != std::string::npos) {
      auto* t6 = reinterpret_cast<sockaddr_in6*>(&to);
      t6->sin6_family = AF_INET6;
      t6->sin6_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET6, client_to, &t6->sin6_addr);
      to_len = sizeof(sockaddr_in6);
    } else {
      auto* t4 = reinterpret_cast<sockaddr_in*>(&to);
      t4->sin_family = AF_INET;
      t4->sin_port = htons(static_cast<uint16_t>(port));
      inet_pton(AF_INET, client_to, &t4->sin_addr);
      to_len = sizeof(sockaddr_in);
    }
    fds[1] = socket(to.ss_family, SOCK_STREAM, 0);
    if (connect(fds[1], reinterpret_cast<sockaddr*>(&to), to_len) != 0) {
      close(listener);
      return;
    }
    fds[0] = accept(listener, nullptr, nullptr);
    close(listener);
  }
  ~Connection() {
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  }
  int ClientPort() const {
    sockaddr_storage client{};
    socklen_t len = sizeof(client);
    getsockname(fds[1], reinterpret_cast<sockaddr*>(&client), &len);
    return ntohs(client.ss_family == AF_INET6
                     ? reinterpret_cast<const sockaddr_in6*>(&client)->sin6_port
                     : reinterpret_cast<const sockaddr_in*>(&client)->sin_port);
  }
};

TEST(StreamGuardTest, PeerOfSocketNamesThePeerAsGrpcDoes) {
  Connection c;
  ASSERT_GE(c.fds[0], 0);
  std::string peer;
  int local_port = 0;
  ASSERT_TRUE(PeerOfSocket(c.fds[0], &peer, &local_port));
  EXPECT_EQ(local_port, c.port);
  EXPECT_EQ(peer, absl::StrCat("ipv4:127.0.0.1:", c.ClientPort()));
  EXPECT_FALSE(PeerOfSocket(-1, &peer, &local_port));
}

// The guard finds a connection among gRPC's by this name: an IPv6 peer, or an IPv4 one of a
// dual-stack listener, named otherwise was never found, so never closed (a review grew a
// shard listening on [::] to 1.7 GB through it).
TEST(StreamGuardTest, PeerOfSocketNamesIpv6AndDualStackPeersAsGrpcDoes) {
  std::string peer;
  int local_port = 0;
  Connection v4_on_dual(true, "127.0.0.1");
  ASSERT_GE(v4_on_dual.fds[0], 0);
  ASSERT_TRUE(PeerOfSocket(v4_on_dual.fds[0], &peer, &local_port));
  EXPECT_EQ(peer, absl::StrCat("ipv4:127.0.0.1:", v4_on_dual.ClientPort()));
  EXPECT_EQ(local_port, v4_on_dual.port);
  Connection v6(true, "::1");
  if (v6.fds[0] < 0) GTEST_SKIP() << "no IPv6 loopback here";
  ASSERT_TRUE(PeerOfSocket(v6.fds[0], &peer, &local_port));
  EXPECT_EQ(peer, absl::StrCat("ipv6:%5B::1%5D:", v6.ClientPort()));
  EXPECT_EQ(AddressOfPeer(peer), "%5B::1%5D");
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

constexpr uint64_t kMiB = 1 << 20;

// Honest peers: each stream carries at most one request, whenever its bytes arrive (before
// or after the look that counts the stream) and however fast.
TEST(ByteCreditTest, RequestsOfAnySizeAndRateAreWithinTheirStreams) {
  ByteCredit credit(3 * kMiB);
  uint64_t read = 0;
  int64_t started = 0;
  EXPECT_FALSE(credit.Look(started, 0, read));
  for (int look = 0; look < 1000; ++look) {
    started += 40;  // 40 requests of 3 MiB a look: 1.2 GB/s at ten looks a second
    read += 40 * 3 * kMiB;
    EXPECT_FALSE(credit.Look(started, 40, read)) << look;
  }
  // A read that ran ahead of the streams it holds (their headers counted next look).
  read += 4 * 3 * kMiB;
  EXPECT_FALSE(credit.Look(started, 0, read));
  started += 4;
  EXPECT_FALSE(credit.Look(started, 4, read));
  // A stream's message arriving over many looks.
  started += 1;
  EXPECT_FALSE(credit.Look(started, 1, read));
  for (int look = 0; look < 30; ++look) {
    read += kMiB / 10;
    EXPECT_FALSE(credit.Look(started, 1, read)) << look;
  }
}

// Frames that carry no request: no new stream, bytes all the same.
TEST(ByteCreditTest, AFloodWithoutStreamsIsOverdrawnAtTheSecondLook) {
  ByteCredit credit(3 * kMiB);
  EXPECT_FALSE(credit.Look(1, 0, 100));
  EXPECT_FALSE(credit.Look(1, 0, 100 + 7 * kMiB));  // overdrawn once (slack is 6 MiB)
  EXPECT_TRUE(credit.Look(1, 0, 100 + 8 * kMiB));   // and again
}

// Streams held open (Health Watch needs no token) earn their message once, not at every look;
// many cheap calls do not bank credit either once they end.
TEST(ByteCreditTest, HeldStreamsOrCheapCallsDoNotBankAFlood) {
  ByteCredit held(3 * kMiB);
  uint64_t read = 0;
  EXPECT_FALSE(held.Look(20, 20, read));
  int overdrawn_at = -1;
  for (int look = 0; look < 20 && overdrawn_at < 0; ++look) {
    read += 30 * kMiB;  // 300 MB/s of empty frames
    if (held.Look(20, 20, read)) overdrawn_at = look;
  }
  EXPECT_GE(overdrawn_at, 0) << "20 held streams let 600 MB of frames through";
  ByteCredit cheap(3 * kMiB);
  read = 0;
  int64_t started = 0;
  EXPECT_FALSE(cheap.Look(started, 0, read));
  for (int look = 0; look < 100; ++look) {
    started += 1000;  // calls that end between looks
    read += 1000 * 200;
    EXPECT_FALSE(cheap.Look(started, 0, read));
  }
  read += 20 * kMiB;
  started += 1;
  cheap.Look(started, 0, read);
  read += 20 * kMiB;
  started += 1;
  EXPECT_TRUE(cheap.Look(started, 0, read)) << "100,000 ended calls banked a flood";
}

}  // namespace
}  // namespace gcomp::server
