#include "coord/lease_keeper.h"

#include <utility>

namespace gcomp::coord {

absl::StatusOr<std::unique_ptr<LeaseKeeper>> LeaseKeeper::Start(
    Store* store, const LeaseKeeperOptions& options, std::function<void()> on_lost) {
  if (options.ttl < absl::Seconds(1)) {
    return absl::InvalidArgumentError("a lease's ttl must be at least 1 s");
  }
  if (options.margin < absl::ZeroDuration() || options.margin >= options.ttl / 2) {
    return absl::InvalidArgumentError("a lease's margin must be in [0, ttl / 2)");
  }
  const Clock::time_point sent = Clock::now();
  absl::StatusOr<LeaseId> id = store->GrantLease(options.ttl);
  if (!id.ok()) return id.status();
  const Clock::time_point until =
      sent + absl::ToChronoNanoseconds(options.ttl - options.margin);
  return std::unique_ptr<LeaseKeeper>(
      new LeaseKeeper(store, options, *id, until, std::move(on_lost)));
}

LeaseKeeper::LeaseKeeper(Store* store, const LeaseKeeperOptions& options, LeaseId id,
                         Clock::time_point valid_until, std::function<void()> on_lost)
    : store_(store), options_(options), id_(id), on_lost_(std::move(on_lost)) {
  {
    absl::MutexLock l(&mu_);
    valid_until_ = valid_until;
  }
  thread_ = std::thread([this] { Run(); });
}

LeaseKeeper::~LeaseKeeper() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
  // Best effort: an unreachable store expires the lease by itself.
  store_->Revoke(id_).IgnoreError();
}

bool LeaseKeeper::Valid() const {
  absl::MutexLock l(&mu_);
  return !lost_ && Clock::now() < valid_until_;
}

bool LeaseKeeper::lost() const {
  absl::MutexLock l(&mu_);
  return lost_;
}

absl::Duration LeaseKeeper::Remaining() const {
  absl::MutexLock l(&mu_);
  const Clock::time_point now = Clock::now();
  if (lost_ || now >= valid_until_) return absl::ZeroDuration();
  return absl::FromChrono(valid_until_ - now);
}

void LeaseKeeper::Lose() {
  {
    absl::MutexLock l(&mu_);
    if (lost_) return;
    lost_ = true;
  }
  if (on_lost_) on_lost_();
}

void LeaseKeeper::Run() {
  const absl::Duration every =
      options_.renew_every > absl::ZeroDuration() ? options_.renew_every : options_.ttl / 3;
  // Failed renewals are retried sooner, so that one lost packet does not cost a period.
  const absl::Duration retry = std::min(every, absl::Milliseconds(200));
  absl::Duration wait = every;
  while (true) {
    bool expired = false;
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), wait);
      if (stop_) return;
      expired = Clock::now() >= valid_until_;
    }
    if (expired) {
      // Not renewed in time (the store did not answer, or this process was paused): the
      // store may have expired the lease already, so nothing bound to it can be trusted.
      Lose();
      return;
    }
    const Clock::time_point sent = Clock::now();
    absl::StatusOr<absl::Duration> ttl = store_->KeepAlive(id_);
    if (absl::IsNotFound(ttl.status())) {
      Lose();
      return;
    }
    if (!ttl.ok()) {
      wait = retry;
      continue;
    }
    {
      absl::MutexLock l(&mu_);
      const Clock::time_point until = sent + absl::ToChronoNanoseconds(*ttl - options_.margin);
      // A renewal that was slower than the time left may already be too late: the lease
      // could have expired before the store received it, and the store then says so
      // (NotFound) rather than grant a TTL, so a granted TTL always counts from `sent`.
      if (until > valid_until_) valid_until_ = until;
    }
    wait = every;
  }
}

}  // namespace gcomp::coord
