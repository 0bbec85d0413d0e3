#include "base/loopback_port.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <mutex>
#include <random>
#include <set>

#include "absl/time/clock.h"

namespace gcomp {

int UnusedPort() {
  int low = 32768;
  {
    std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
    int first = 0;
    if (range >> first && first > 2048) low = first;
  }
  static std::mt19937 rng(static_cast<uint32_t>(getpid()) ^
                          static_cast<uint32_t>(absl::ToUnixMicros(absl::Now())));
  const int base = std::max(1024, low / 2);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = base + static_cast<int>(rng() % static_cast<uint32_t>(low - base));
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(fd);
    if (free) return port;
  }
  return -1;
}

int FreePort() {
  static std::mutex mu;
  static std::set<int> given;
  std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0; attempt < 100; ++attempt) {
    const int port = UnusedPort();
    if (port <= 0 || given.insert(port).second) return port;
  }
  return -1;
}

}  // namespace gcomp
