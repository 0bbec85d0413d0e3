// Many TCP connections to 127.0.0.1:port held open by a child process, for tests of what a
// server does when flooded: the client ends take none of the test process's descriptors.
#ifndef GCOMP_BASE_TESTING_CONNECTION_FLOOD_H_
#define GCOMP_BASE_TESTING_CONNECTION_FLOOD_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace gcomp::testing {

class ConnectionFlood {
 public:
  // Opens `n` connections (nothing sent on them) from a child process and, `settle_ms`
  // after the last, counts those the server has closed.
  ConnectionFlood(int port, int n, int settle_ms = 300) {
    int report[2], release[2];
    if (pipe(report) != 0 || pipe(release) != 0) return;
    child_ = fork();
    if (child_ == 0) {
      close(report[0]);
      close(release[1]);
      rlimit files{};  // the test may have lowered its own
      getrlimit(RLIMIT_NOFILE, &files);
      files.rlim_cur = files.rlim_max;
      setrlimit(RLIMIT_NOFILE, &files);
      std::vector<int> held;
      for (int i = 0; i < n; ++i) held.push_back(Connect(port));
      usleep(static_cast<useconds_t>(settle_ms) * 1000);
      int32_t closed[2] = {0, 0};  // all, and the first connection alone
      for (int fd : held) closed[0] += ClosedByPeer(fd) ? 1 : 0;
      closed[1] = ClosedByPeer(held.empty() ? -1 : held[0]) ? 1 : 0;
      (void)!write(report[1], closed, sizeof(closed));
      char c;
      (void)!read(release[0], &c, 1);
      _exit(0);
    }
    close(report[1]);
    close(release[0]);
    report_ = report[0];
    release_ = release[1];
  }
  ~ConnectionFlood() { Release(); }
  ConnectionFlood(const ConnectionFlood&) = delete;
  ConnectionFlood& operator=(const ConnectionFlood&) = delete;

  // Connections the server had closed (or that never connected), and whether the first
  // was among them. Blocks until the child has counted; call once.
  std::pair<int, bool> Closed() {
    int32_t closed[2] = {-1, -1};
    if (read(report_, closed, sizeof(closed)) != sizeof(closed)) return {-1, false};
    return {closed[0], closed[1] != 0};
  }
  // Closes every connection (the child exits).
  void Release() {
    if (child_ <= 0) return;
    close(release_);
    close(report_);
    int status = 0;
    waitpid(child_, &status, 0);
    child_ = 0;
  }

 private:
  static int Connect(int port) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      if (fd >= 0) close(fd);
      return -1;
    }
    return fd;
  }
  // A read sees end of file or a reset; a connection that failed counts as closed.
  static bool ClosedByPeer(int fd) {
    if (fd < 0) return true;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return false;
    char c;
    return recv(fd, &c, 1, MSG_DONTWAIT) <= 0;
  }

  pid_t child_ = -1;
  int report_ = -1, release_ = -1;
};

}  // namespace gcomp::testing

#endif  // GCOMP_BASE_TESTING_CONNECTION_FLOOD_H_
