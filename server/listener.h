// The shard's own accept loop in front of gRPC (gRPC's external connection acceptor).
//
// gRPC 1.51 stops listening for good once one accept() fails for want of a file
// descriptor: a peer that opened connections until the shard ran out of descriptors left
// it deaf to every new worker, admin call and probe, even after those connections closed.
// Its listener also takes any number of connections, each costing the shard 5-22 KiB.
// Here a failed accept is retried after a pause, and a connection past the caps below is
// closed at once; the caps only ever refuse new connections, never touch open ones.
#ifndef GCOMP_SERVER_LISTENER_H_
#define GCOMP_SERVER_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/server_builder.h"

namespace gcomp::server {

struct ListenerOptions {
  // Connections held at once, about: the count is read from descriptor numbers (the kernel
  // hands out the lowest free one), so descriptors the process opens for other things
  // after Start() count too. 0: no cap but the descriptor limit's.
  uint64_t max_connections = 0;
  // A connection that would leave fewer free descriptors than this below the soft
  // RLIMIT_NOFILE is refused, so checkpoints, peer channels and gRPC itself still get one.
  int reserve_fds = 128;
  // How long to wait before accepting again after accept() failed for want of
  // descriptors or memory (the connection waits in the kernel's backlog meanwhile).
  int retry_ms = 50;
  // Names the cap in the log line of a refusal ("limits.max_connections").
  std::string cap_name = "max_connections";
  // Called with each connection's descriptor within the caps; an error closes it at once,
  // counted as refused and its message logged (a peer's address refused for a while).
  std::function<absl::Status(int fd)> admit;
  // Called with each connection's descriptor just before it is handed to gRPC.
  std::function<void(int fd)> on_accepted;
};

class Listener {
 public:
  // Binds every address `address` ("host:port", "[v6]:port"; port 0 picks a free one,
  // the same for all addresses the host resolves to) and listens. The loop starts with
  // Start(). UnavailableError naming the address when nothing could be bound.
  static absl::StatusOr<std::unique_ptr<Listener>> Bind(const std::string& address,
                                                        ListenerOptions options);
  ~Listener();  // Stop()s
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int port() const { return port_; }

  // Hands every accepted connection to `acceptor` (owned from now on) from a thread of
  // its own. gRPC closes connections handed over before its server has started.
  void Start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
  // Stops accepting and closes the listening sockets; connections already handed over
  // stay gRPC's. Idempotent.
  void Stop();

  // Connections closed at once for a cap (descriptors or max_connections) or by `admit`,
  // since Bind().
  uint64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  Listener(std::vector<int> fds, int port, ListenerOptions options);
  void Loop();
  // Whether accepted descriptor `fd` is past a cap (and then why, for the log).
  bool PastCap(int fd, std::string* why) const;
  // Whether options_.admit refuses `fd` (and then its message).
  bool NotAdmitted(int fd, std::string* why) const;
  void LogRefusal(const std::string& why);

  const std::vector<int> fds_;  // listening sockets
  const int port_;
  const ListenerOptions options_;
  int wake_[2] = {-1, -1};   // a pipe: Stop() writes a byte to end the loop's poll()
  int first_free_fd_ = 0;    // lowest free descriptor at Start(): what the process held then
  uint64_t soft_limit_ = 0;  // RLIMIT_NOFILE's soft limit at Start()
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
  std::thread thread_;
  std::atomic<uint64_t> refused_{0};
  absl::Mutex log_mu_;
  int64_t last_log_ns_ ABSL_GUARDED_BY(log_mu_) = 0;
  uint64_t unlogged_ ABSL_GUARDED_BY(log_mu_) = 0;
  bool stopped_ = false;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_LISTENER_H_
