// Bounds the calls one client has in flight on a shard (config
// limits.max_calls_per_client), so that one client cannot hold every server thread with
// pushes that wait for a step. A client is a connection as gRPC names its peer
// ("ipv4:10.0.0.7:51234"), or any other name the caller picks (the shard also bounds the
// pushes of each worker id, whatever connections they come on). Thread-safe.
//
//   absl::StatusOr<CallLimiter::Slot> slot = limiter.Acquire(context->peer());
//   if (!slot.ok()) return ToGrpc(slot.status());   // ResourceExhausted
//   ... serve the call; the slot is released when it goes out of scope.
#ifndef GCOMP_SERVER_CALL_LIMITER_H_
#define GCOMP_SERVER_CALL_LIMITER_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace gcomp::server {

class CallLimiter {
 public:
  // One call in flight; releases it when destroyed. Move-only.
  class Slot {
   public:
    Slot(Slot&& other) noexcept : limiter_(other.limiter_), client_(std::move(other.client_)) {
      other.limiter_ = nullptr;
    }
    Slot& operator=(Slot&&) = delete;
    Slot(const Slot&) = delete;
    ~Slot();

   private:
    friend class CallLimiter;
    Slot(CallLimiter* limiter, std::string client) : limiter_(limiter), client_(std::move(client)) {}
    CallLimiter* limiter_;  // borrowed; null once moved from
    std::string client_;
  };

  // `limit` names the bound in refusals, e.g. "limits.max_calls_per_client = 1024".
  CallLimiter(uint32_t max_calls, std::string limit)
      : max_calls_(max_calls), limit_(std::move(limit)) {}
  explicit CallLimiter(uint32_t max_calls_per_client)
      : CallLimiter(max_calls_per_client,
                    "limits.max_calls_per_client = " + std::to_string(max_calls_per_client)) {}
  CallLimiter(const CallLimiter&) = delete;
  CallLimiter& operator=(const CallLimiter&) = delete;

  // ResourceExhausted naming the limit when `client` is at it ("... calls in flight on this
  // shard (limit)": clients retry such refusals after a backoff, see IsBusyRefusal).
  absl::StatusOr<Slot> Acquire(const std::string& client);

  // Calls `client` has in flight (0 for an unknown client).
  uint32_t in_flight(const std::string& client) const;
  // Clients with calls in flight (entries are dropped at zero, so this stays bounded).
  size_t clients() const;

 private:
  void Release(const std::string& client);

  const uint32_t max_calls_;  // constant after construction
  const std::string limit_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, uint32_t> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_CALL_LIMITER_H_
