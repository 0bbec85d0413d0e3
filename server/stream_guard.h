// Holds peers that ignore the server's stream limit to it.
//
// gRPC 1.51 applies SETTINGS_MAX_CONCURRENT_STREAMS to a connection only once the peer has
// acknowledged the server's SETTINGS. A peer that never does may open streams without limit,
// and each holds 12-18 KB of gRPC's memory outside its resource quota: a review took a shard
// past 1 GB from one connection of health Watch or header-only streams, and once to a crash
// inside gRPC. StreamGuard reads gRPC's own per-connection counters (channelz: streams
// started, succeeded, failed) a few times a second and shuts down any connection it was
// given with more streams open than its cap; the peer's calls fail, and an honest client
// (which keeps the limit) is never near it. Thread-safe.
//
//   StreamGuard guard(options);
//   listener_options.on_accepted = [&guard](int fd) { guard.Track(fd, cap); };
//   guard.Start();
#ifndef GCOMP_SERVER_STREAM_GUARD_H_
#define GCOMP_SERVER_STREAM_GUARD_H_

#include <cstdint>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace gcomp::server {

class StreamGuard {
 public:
  struct Options {
    // How often gRPC's counters are read: every `every`, or `per_connection` times the
    // connections tracked where that is longer (each costs a channelz query).
    absl::Duration every = absl::Milliseconds(100);
    absl::Duration per_connection = absl::Microseconds(500);
  };

  explicit StreamGuard(Options options) : options_(options) {}
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  ~StreamGuard();  // stops the thread

  // A connection handed to gRPC: descriptor `fd` may have at most `max_open_streams` open.
  // The descriptor stays gRPC's; the guard only ever shuts it down.
  void Track(int fd, uint32_t max_open_streams);
  // Starts the thread that calls Sweep (see Options::every).
  void Start();
  // Reads the counters of every server connection in this process and shuts down the
  // tracked ones over their cap; returns how many it shut down.
  size_t Sweep();

  uint64_t closed() const;  // connections shut down so far

 private:
  struct Tracked {
    int fd;
    int local_port;
    uint32_t max_open_streams;
  };

  const Options options_;
  mutable absl::Mutex mu_;
  // By the peer as gRPC names it ("ipv4:10.0.0.7:51234").
  absl::flat_hash_map<std::string, Tracked> tracked_ ABSL_GUARDED_BY(mu_);
  uint64_t closed_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread thread_;
};

// "ipv4:10.0.0.7:51234" / "ipv6:[::1]:51234" for a socket's peer (as gRPC names peers), and
// the socket's local port; false where it has none (closed, not IP).
bool PeerOfSocket(int fd, std::string* peer, int* local_port);

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_STREAM_GUARD_H_
