#include "server/listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"

namespace gcomp::server {
namespace {

constexpr int kBacklog = 1024;

// A listening socket on `ai`, or -1 with the reason in *error and errno set.
int ListenOn(const addrinfo& ai, std::string* error) {
  const int fd =
      socket(ai.ai_family, ai.ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai.ai_protocol);
  if (fd < 0) {
    *error = std::strerror(errno);
    return -1;
  }
  const int one = 1, zero = 0;
  // Restarts bind while the last process's connections linger in TIME_WAIT. No
  // SO_REUSEPORT: a second shard on the same port must fail, not share it.
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  // "[::]" takes IPv4 too, as gRPC's own listener does.
  if (ai.ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (bind(fd, ai.ai_addr, ai.ai_addrlen) != 0 || listen(fd, kBacklog) != 0) {
    const int e = errno;
    *error = std::strerror(e);
    close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int PortOf(int fd) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&a)->sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&a)->sin6_port);
  return 0;
}

int LowestFreeFd() {
  const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) close(fd);
  return fd < 0 ? 0 : fd;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Listener>> Listener::Bind(const std::string& address,
                                                         ListenerOptions options) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("listen address '", address, "' is not host:port"));
  }
  std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (int e = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
      e != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": ", gai_strerror(e)));
  }
  // An address of a family this host lacks (IPv6 off in a container) is skipped, and so
  // is one that fails after another bound (a wildcard IPv4 address after a dual-stack
  // "::" is taken already). Any other failure, a port in use above all, is an error.
  std::vector<int> fds;
  int bound_port = 0;
  std::string error;
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    if (bound_port != 0) {
      if (ai->ai_family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(bound_port);
      } else if (ai->ai_family == AF_INET6) {
        reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_port = htons(bound_port);
      }
    }
    const int fd = ListenOn(*ai, &error);
    if (fd < 0) {
      const bool no_such_family =
          errno == EAFNOSUPPORT || errno == EADDRNOTAVAIL || errno == EPROTONOSUPPORT;
      if (fds.empty() && !no_such_family) break;
      continue;
    }
    fds.push_back(fd);
    if (bound_port == 0) bound_port = PortOf(fd);
  }
  freeaddrinfo(found);
  if (fds.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address, ": ", error));
  }
  std::unique_ptr<Listener> l(new Listener(std::move(fds), bound_port, std::move(options)));
  if (pipe2(l->wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, ": pipe2: ", std::strerror(errno)));
  }
  return l;
}

Listener::Listener(std::vector<int> fds, int port, ListenerOptions options)
    : fds_(std::move(fds)), port_(port), options_(std::move(options)) {}

Listener::~Listener() { Stop(); }

void Listener::Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
  acceptor_ = std::move(acceptor);
  // About the lowest free descriptor now (every one below is open): a connection accepted
  // later gets the lowest one free then, so its number minus this is about how many
  // connections (and descriptors opened since) the process holds.
  first_free_fd_ = LowestFreeFd();
  rlimit files{};
  soft_limit_ = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                    ? files.rlim_cur
                    : uint64_t{1} << 30;
  thread_ = std::thread([this] { Loop(); });
}

void Listener::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (thread_.joinable()) {
    const char byte = 0;
    (void)!write(wake_[1], &byte, 1);
    thread_.join();
  }
  for (int fd : fds_) close(fd);
  for (int fd : wake_) {
    if (fd >= 0) close(fd);
  }
}

bool Listener::PastCap(int fd, std::string* why) const {
  const uint64_t n = static_cast<uint64_t>(fd);
  if (n + options_.reserve_fds >= soft_limit_) {
    *why = absl::StrCat("descriptor ", fd, " of the open-file limit ", soft_limit_, " (",
                        options_.reserve_fds, " kept for the shard itself)");
    return true;
  }
  if (options_.max_connections != 0 && n >= first_free_fd_ + options_.max_connections) {
    *why = absl::StrCat("about ", n - first_free_fd_, " connections open (", options_.cap_name,
                        " = ", options_.max_connections, ")");
    return true;
  }
  return false;
}

bool Listener::NotAdmitted(int fd, std::string* why) const {
  if (!options_.admit) return false;
  const absl::Status admitted = options_.admit(fd);
  if (admitted.ok()) return false;
  *why = std::string(admitted.message());
  return true;
}

void Listener::LogRefusal(const std::string& why) {
  // One line per 10 s at most: a flood must not turn into a flood of log lines.
  absl::MutexLock lock(&log_mu_);
  const int64_t now = absl::GetCurrentTimeNanos();
  ++unlogged_;
  if (last_log_ns_ != 0 && now - last_log_ns_ < 10'000'000'000) return;
  log::Warn(
      "port {}: not accepting a connection: {} ({} such since the last line; {} "
      "connections refused in all)",
      port_, why, unlogged_, refused());
  last_log_ns_ = now;
  unlogged_ = 0;
}

void Listener::Loop() {
  std::vector<pollfd> polled;
  for (int fd : fds_) polled.push_back({fd, POLLIN, 0});
  polled.push_back({wake_[0], POLLIN, 0});
  for (;;) {
    for (pollfd& p : polled) p.revents = 0;
    if (poll(polled.data(), polled.size(), -1) < 0 && errno != EINTR) {
      log::Error("listener poll: {}", std::strerror(errno));
      absl::SleepFor(absl::Milliseconds(options_.retry_ms));
      continue;
    }
    if (polled.back().revents != 0) return;
    for (size_t i = 0; i + 1 < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      for (;;) {
        const int fd = accept4(polled[i].fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          // EMFILE, ENFILE, ENOBUFS, ENOMEM: the connection stays in the backlog; try
          // again once something may have been freed.
          LogRefusal(absl::StrCat("accept failed: ", std::strerror(errno), "; retrying in ",
                                  options_.retry_ms, " ms"));
          absl::SleepFor(absl::Milliseconds(options_.retry_ms));
          break;
        }
        std::string why;
        if (PastCap(fd, &why) || NotAdmitted(fd, &why)) {
          // Counted before the peer can see the close (a test reads the count then).
          refused_.fetch_add(1, std::memory_order_relaxed);
          close(fd);
          LogRefusal(why);
          continue;
        }
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters p;
        p.listener_fd = polled[i].fd;
        p.fd = fd;
        if (options_.on_accepted) options_.on_accepted(fd);
        acceptor_->HandleNewConnection(&p);
      }
    }
  }
}

}  // namespace gcomp::server
