// Bounds what a peer that does not read its replies can hold on a shard.
//
// gRPC 1.51's synchronous server writes a unary call's reply on the handler's thread and
// waits until the peer's flow-control window takes it. A peer that opens its window at zero
// (or stops reading its socket) and sends a few hundred cheap calls would hold as many
// request threads, for as long as its connection lasts, and every other call would get
// "Server Threadpool Exhausted". UnreadReplies keeps each reply from the moment its handler
// returns until its call ends; a sweep a few times a second
//  - cancels, when one address (the peer's host, whatever its port or connection) has more
//    than `max_per_address` replies unread and the oldest has waited `min_age`, all of that
//    address's unread replies (their threads are freed);
//  - cancels, when all addresses together have more than `max_per_address` unread, every
//    reply that has waited `min_age` (several addresses each under the bound);
//  - cancels any reply still unread `timeout` after it began;
// and refuses the calls of an address it cancelled replies of (Admit): for `first_refusal`,
// doubling with each further cancellation up to `timeout`, forgiven after `timeout` without
// one. Honest clients read their replies as they come (gRPC's own threads do): a burst of
// results on a fast link is read well within `min_age`, and a client refused once by
// mistake retries past the first refusal. Thread-safe.
//
//   auto replies = std::make_shared<UnreadReplies>(options);
//   replies->StartWatchdog();
//   builder.experimental().SetInterceptorCreators(  // first in the list
//       {std::make_unique<UnreadRepliesInterceptorFactory>(replies), ...});
//   ... in each handler: if (absl::Status s = replies->Admit(context->peer()); !s.ok()) ...
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
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/address_refusals.h"

namespace gcomp::server {

class UnreadReplies {
 public:
  struct Options {
    // Replies one address may leave unread at once for longer than `min_age`. A shard's
    // honest clients have at most all their calls' replies on the way at the end of a step;
    // ShardServer uses half the request threads, so that one address cannot keep them all.
    uint32_t max_per_address = 128;
    // How long the oldest of more than max_per_address replies must have waited before they
    // are cancelled: results released together read on a fast link are all read by then.
    absl::Duration min_age = absl::Seconds(1);
    // How long any reply may stay unread; also the longest refusal. ShardServer uses
    // rpc_timeout_ms: a worker has given up on its call by then.
    absl::Duration timeout = absl::Seconds(30);
    // The first refusal of an address; each further one (within `timeout`) doubles.
    absl::Duration first_refusal = absl::Seconds(1);
    // Addresses never refused (the config's limits.never_refused); their unread replies are
    // still cancelled.
    std::vector<std::string> never_refused;
    // How often the watchdog sweeps.
    absl::Duration sweep_every = absl::Milliseconds(100);
    // Called (outside any lock) with the number of replies each sweep cancelled.
    std::function<void(uint64_t)> on_cancelled;
  };

  // A reply being written, cancelled through this (the interceptor's holds a reference on
  // the gRPC call, so the call outlives every Cancel).
  class Reply {
   public:
    virtual ~Reply() = default;
    virtual void Cancel() = 0;
  };

  explicit UnreadReplies(Options options)
      : options_(std::move(options)), refusals_(options_.first_refusal, options_.timeout, options_.never_refused) {}
  UnreadReplies(const UnreadReplies&) = delete;
  UnreadReplies& operator=(const UnreadReplies&) = delete;
  ~UnreadReplies();  // stops the watchdog

  // Starts a thread that calls Sweep every sweep_every (tests call Sweep themselves).
  void StartWatchdog();

  // A reply to `peer` (gRPC's peer string, "ipv4:10.0.0.7:51234") begins; returns its id
  // for End.
  uint64_t Begin(absl::string_view peer, std::shared_ptr<Reply> reply);
  // The reply's call ended (read, failed or cancelled).
  void End(uint64_t id);
  // ResourceExhausted, naming the address and why, while `peer`'s address is refused.
  // Clients retry it like any busy refusal (cluster::IsBusyRefusal).
  absl::Status Admit(absl::string_view peer, absl::Time now = absl::Now());
  // Cancels what the rules above say as of `now` and refuses those addresses; returns how
  // many replies it cancelled.
  size_t Sweep(absl::Time now = absl::Now());

  uint64_t cancelled() const;  // replies cancelled so far
  size_t unread() const;       // replies begun and not ended

 private:
  struct Entry {
    std::string address;
    absl::Time begun;
    std::shared_ptr<Reply> reply;
    bool cancelled = false;
  };

  // Marks the entry cancelled and copies its Reply into `out`.
  void TakeForCancel(Entry* entry, std::vector<std::shared_ptr<Reply>>* out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  AddressRefusals refusals_ ABSL_GUARDED_BY(mu_);
  uint64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification stop_;
  std::thread watchdog_;
};

// Puts every unary call's reply into an UnreadReplies from the first send of the reply until
// the call ends. Install it first among the server's interceptors. Each interceptor shares
// `replies`: gRPC may end a call (and its interceptor) on one of its own threads after the
// server is gone, and TSan once caught that against the UnreadReplies' destruction.
class UnreadRepliesInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit UnreadRepliesInterceptorFactory(std::shared_ptr<UnreadReplies> replies)
      : replies_(std::move(replies)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  const std::shared_ptr<UnreadReplies> replies_;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_UNREAD_REPLIES_H_
