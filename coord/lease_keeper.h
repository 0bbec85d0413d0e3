// A store lease kept alive from a thread of its own: a shard's proof of life. Keys bound
// to the lease (the shard's membership key, the coordinator's key) vanish when it expires.
//
// Fencing: Valid() is true only while the lease provably still exists. A renewal sent at
// time t that the store granted for ttl keeps the lease alive until at least t + ttl (the
// store counts from when it received the renewal), so Valid() holds until then, less a
// safety margin, on the monotonic clock. A process that was paused, or cut off from the
// store, finds Valid() false as soon as it runs again past that time, before any renewal
// could have been sent: it must stop acknowledging work, since the cluster may already have
// given its chunks to others. A lost lease stays lost; start a new keeper to come back.
// Thread-safe.
#ifndef GCOMP_COORD_LEASE_KEEPER_H_
#define GCOMP_COORD_LEASE_KEEPER_H_

#include <chrono>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "coord/store.h"

namespace gcomp::coord {

struct LeaseKeeperOptions {
  // The lease's time to live (the store rounds it up to whole seconds).
  absl::Duration ttl = absl::Seconds(5);
  // Renewal period; 0: ttl / 3, so that two renewals in a row may fail before it expires.
  absl::Duration renew_every = absl::ZeroDuration();
  // Valid() ends this much before the proven expiry (clock drift, the caller's own work).
  absl::Duration margin = absl::Milliseconds(250);
};

class LeaseKeeper {
 public:
  // Grants the lease and starts renewing it. `on_lost` (may be empty) runs once, from the
  // keeper's thread, when the lease is found expired or can no longer be proven alive.
  // `store` must outlive the keeper.
  static absl::StatusOr<std::unique_ptr<LeaseKeeper>> Start(Store* store,
                                                            const LeaseKeeperOptions& options,
                                                            std::function<void()> on_lost = {});
  // Stops renewing and revokes the lease, so its keys go at once rather than at expiry.
  ~LeaseKeeper();
  LeaseKeeper(const LeaseKeeper&) = delete;
  LeaseKeeper& operator=(const LeaseKeeper&) = delete;

  LeaseId id() const { return id_; }
  bool Valid() const ABSL_LOCKS_EXCLUDED(mu_);
  bool lost() const ABSL_LOCKS_EXCLUDED(mu_);
  // How long Valid() still holds without another renewal (zero once it does not).
  absl::Duration Remaining() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Clock = std::chrono::steady_clock;
  LeaseKeeper(Store* store, const LeaseKeeperOptions& options, LeaseId id,
              Clock::time_point valid_until, std::function<void()> on_lost);
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Marks the lease lost (once) and calls on_lost_.
  void Lose() ABSL_LOCKS_EXCLUDED(mu_);

  Store* const store_;  // not owned
  const LeaseKeeperOptions options_;
  const LeaseId id_;
  const std::function<void()> on_lost_;
  mutable absl::Mutex mu_;
  Clock::time_point valid_until_ ABSL_GUARDED_BY(mu_);
  bool lost_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_LEASE_KEEPER_H_
