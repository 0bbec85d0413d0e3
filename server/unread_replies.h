// Bounds what a peer that does not read its replies can hold on a shard.
//
// gRPC 1.51's synchronous server writes a unary call's reply on the handler's thread and
// waits until the peer's flow-control window takes it. A peer that opens its window at zero
// (or stops reading its socket) and sends a few hundred cheap calls would hold as many
// request threads, for as long as its connection lasts, and every other call would get
// "Server Threadpool Exhausted". UnreadReplies keeps each reply from the moment its handler
// returns until its call ends, and
//  - cancels a reply still unread `timeout` after it began (its thread is freed);
//  - when one address (the peer's host, whatever its port or connection) has more than
//    `max_per_address` replies unread at once, cancels them and refuses that address's
//    calls (Admit) for `timeout`.
// Honest clients read their replies as they come (gRPC's own threads do), so they meet
// neither bound. Thread-safe.
//
//   UnreadReplies replies(options);
//   replies.StartWatchdog();
//   builder.experimental().SetInterceptorCreators(  // first in the list
//       {std::make_unique<UnreadRepliesInterceptorFactory>(&replies), ...});
//   ... in each handler: if (absl::Status s = replies.Admit(context->peer()); !s.ok()) ...
#ifndef GCOMP_SERVER_UNREAD_REPLIES_H_
#define GCOMP_SERVER_UNREAD_REPLIES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"

namespace gcomp::server {

class UnreadReplies {
 public:
  struct Options {
    // Replies one address may leave unread at once. A shard's honest clients have at most
    // all their calls' replies on the way at the end of a step; ShardServer uses half the
    // request threads, so that one address can never take them all.
    uint32_t max_per_address = 128;
    // How long a reply may stay unread before its call is cancelled, and how long an address
    // that went over max_per_address is refused. ShardServer uses rpc_timeout_ms: a worker
    // has given up on a call by then.
    absl::Duration timeout = absl::Seconds(30);
    // Called (outside any lock) with the number of replies each cancellation cancelled.
    std::function<void(uint64_t)> on_cancelled;
  };

  // A reply being written, cancelled through this (the interceptor's holds a reference on
  // the gRPC call, so the call outlives every Cancel).
  class Reply {
   public:
    virtual ~Reply() = default;
    virtual void Cancel() = 0;
  };

  explicit UnreadReplies(Options options) : options_(std::move(options)) {}
  UnreadReplies(const UnreadReplies&) = delete;
  UnreadReplies& operator=(const UnreadReplies&) = delete;
  ~UnreadReplies();  // stops the watchdog

  // Starts a thread that calls CancelOverdue a few times per timeout (tests call it).
  void StartWatchdog();

  // A reply to `peer` (gRPC's peer string, "ipv4:10.0.0.7:51234") begins; returns its id
  // for End. Past max_per_address unread replies of that address, cancels them all.
  uint64_t Begin(absl::string_view peer, std::shared_ptr<Reply> reply);
  // The reply's call ended (read, failed or cancelled).
  void End(uint64_t id);
  // ResourceExhausted, naming the address and why, while `peer`'s address is refused.
  // Clients retry it like any busy refusal (cluster::IsBusyRefusal).
  absl::Status Admit(absl::string_view peer, absl::Time now = absl::Now());
  // Cancels the replies begun more than `timeout` before `now`, and refuses their
  // addresses for `timeout`; returns how many it cancelled.
  size_t CancelOverdue(absl::Time now = absl::Now());

  uint64_t cancelled() const;  // replies cancelled so far
  size_t unread() const;       // replies begun and not ended

  // "10.0.0.7" of "ipv4:10.0.0.7:51234", "[::1]" of "ipv6:[::1]:51234"; anything without
  // a port as it is.
  static std::string AddressOf(absl::string_view peer);

 private:
  struct Entry {
    std::string address;
    absl::Time begun;
    std::shared_ptr<Reply> reply;
    bool cancelled = false;
  };
  struct Address {
    uint32_t unread = 0;
    absl::Time refused_until = absl::InfinitePast();
  };

  // Marks the entry cancelled and moves its Reply into `out`.
  void TakeForCancel(Entry* entry, std::vector<std::shared_ptr<Reply>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelOutsideLock(std::vector<std::shared_ptr<Reply>> replies);

  const Options options_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Address> addresses_ ABSL_GUARDED_BY(mu_);
  uint64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread watchdog_;
};

// Puts every unary call's reply into an UnreadReplies from the first send of the reply until
// the call ends. Install it first among the server's interceptors. `replies` is borrowed and
// must outlive the server.
class UnreadRepliesInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit UnreadRepliesInterceptorFactory(UnreadReplies* replies) : replies_(replies) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  UnreadReplies* replies_;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_UNREAD_REPLIES_H_
