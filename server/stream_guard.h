// Holds peers that ignore the server's stream limit to it.
//
// gRPC 1.51 applies SETTINGS_MAX_CONCURRENT_STREAMS to a connection only once the peer has
// acknowledged the server's SETTINGS. A peer that never does may open streams without limit,
// and each holds 12-18 KB of gRPC's memory outside its resource quota: a review took a shard
// past 1 GB from one connection of health Watch or header-only streams, and once to a crash
// inside gRPC. StreamGuard reads gRPC's own per-connection counters (channelz: streams
// started, succeeded, failed) a few times a second and shuts down any connection it was
// given with more streams open than its cap; the peer's calls fail, and an honest client
// (which keeps the limit) is never near it.
//
// HTTP/2 rapid reset (CVE-2023-44487: streams opened and reset at once, which the stream
// limit does not count) is caught by the same cap: gRPC 1.51 keeps each reset stream until
// a request thread has taken its call, so a flood piles up open streams (a review saw 2.4 GB
// and every honest call failing). A peer reconnects at once, though, so the address of a
// connection shut down over its stream cap is refused new connections (Admit) for
// `first_refusal`, doubling with each further closure up to `longest_refusal`; one shut
// down for its bytes (ByteCredit: a frame flood, or one oversized message) costs only
// itself. Thread-safe.
//
//   StreamGuard guard(options);
//   listener_options.admit = [&guard](int fd) { return guard.Admit(fd); };
//   listener_options.on_accepted = [&guard](int fd) { guard.Track(fd, cap); };
//   guard.Start();
#ifndef GCOMP_SERVER_STREAM_GUARD_H_
#define GCOMP_SERVER_STREAM_GUARD_H_

#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/address_refusals.h"

namespace gcomp::server {

// What one connection may still send. Every stream it starts may carry one request
// message (`per_stream` bytes with framing); the bytes gRPC reads from the connection
// spend that credit. Credit is kept only for the streams still open and `kSlackStreams`
// more, so that neither streams held open nor many cheap calls bank a flood: the frames
// that carry no request (empty CONTINUATION, RST_STREAM or WINDOW_UPDATE of idle streams,
// PING), which gRPC 1.51 takes without limit, overdraw it. An honest peer's bytes all
// belong to its requests, whatever its rate.
class ByteCredit {
 public:
  static constexpr int64_t kSlackStreams = 2;
  explicit ByteCredit(uint64_t per_stream) : per_stream_(static_cast<int64_t>(per_stream)) {}
  // One look at the connection's counters: streams started and open, bytes read. True
  // when it was overdrawn at this look and the one before (a read can run a little ahead
  // of the streams it starts, and the next look catches up).
  bool Look(int64_t started, int64_t open, uint64_t read);

 private:
  int64_t per_stream_;
  bool looked_ = false;
  int64_t started_ = 0;
  uint64_t read_ = 0;
  int64_t credit_ = 0;
  int overdrawn_ = 0;  // looks in a row
};

class StreamGuard {
 public:
  struct Options {
    // How often gRPC's counters are read: every `every`, or `per_connection` times the
    // connections tracked where that is longer (each costs a channelz query).
    absl::Duration every = absl::Milliseconds(100);
    absl::Duration per_connection = absl::Microseconds(500);
    // How long the address of a connection shut down over its stream cap is refused new
    // ones; each further
    // closure (after a refusal ended, while remembered) doubles it, up to the longest.
    absl::Duration first_refusal = absl::Seconds(1);
    absl::Duration longest_refusal = absl::Seconds(60);
    // Addresses never refused (the config's limits.never_refused); their offending
    // connections are still shut down.
    std::vector<std::string> never_refused;
    // The largest request message (the config's max_message_bytes): with it, each
    // connection's bytes are held to what its streams could carry (ByteCredit), and one
    // over that at two looks in a row is shut down like one over its stream cap. 0: no
    // such check.
    uint64_t max_message_bytes = 0;
    // Called (outside the lock) with the connections each sweep shut down, and once for
    // each connection Admit refused.
    std::function<void(uint64_t)> on_closed;
    std::function<void()> on_refused;
  };

  explicit StreamGuard(Options options)
      : options_(std::move(options)), refusals_(options_.first_refusal, options_.longest_refusal,
                  options_.never_refused) {}
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;
  ~StreamGuard();  // stops the thread

  // A connection handed to gRPC: descriptor `fd` may have at most `max_open_streams` open.
  // The descriptor stays gRPC's; the guard only ever shuts it down.
  void Track(int fd, uint32_t max_open_streams);
  // ResourceExhausted naming the address and how much longer, for a new connection `fd`
  // from an address refused now; OK otherwise.
  absl::Status Admit(int fd);
  // Starts the thread that calls Sweep (see Options::every).
  void Start();
  // Reads the counters of every server connection in this process and shuts down the
  // tracked ones over their cap; returns how many it shut down.
  size_t Sweep();

  uint64_t closed() const;  // connections shut down so far
  uint64_t refused() const;  // connections not admitted so far

 private:
  struct Tracked {
    int fd;
    int local_port;
    uint32_t max_open_streams;
    ByteCredit credit;
  };

  const Options options_;
  mutable absl::Mutex mu_;
  // By the peer as gRPC names it ("ipv4:10.0.0.7:51234").
  absl::flat_hash_map<std::string, Tracked> tracked_ ABSL_GUARDED_BY(mu_);
  AddressRefusals refusals_ ABSL_GUARDED_BY(mu_);
  uint64_t closed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread thread_;
};

// A socket's peer named exactly as gRPC names it ("ipv4:10.0.0.7:51234",
// "ipv6:%5B::1%5D:51234"; an IPv4 client of a dual-stack listener as "ipv4:..."), and the
// socket's local port; false where it has none (closed, not IP).
bool PeerOfSocket(int fd, std::string* peer, int* local_port);

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_STREAM_GUARD_H_
