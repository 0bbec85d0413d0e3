#include "server/call_limiter.h"

#include "absl/strings/str_cat.h"
#include "cluster/grpc_status.h"

namespace gcomp::server {

CallLimiter::Slot::~Slot() {
  if (limiter_ != nullptr) limiter_->Release(client_);
}

absl::StatusOr<CallLimiter::Slot> CallLimiter::Acquire(const std::string& client) {
  absl::MutexLock lock(&mu_);
  uint32_t& n = in_flight_[client];
  if (n >= max_calls_) {
    return cluster::BusyRefusal(absl::StrCat(
        "client ", client, " already has ", n, " calls in flight on this shard (", limit_, ")"));
  }
  ++n;
  return Slot(this, client);
}

void CallLimiter::Release(const std::string& client) {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(client);
  if (it == in_flight_.end()) return;
  if (--it->second == 0) in_flight_.erase(it);
}

uint32_t CallLimiter::in_flight(const std::string& client) const {
  absl::MutexLock lock(&mu_);
  auto it = in_flight_.find(client);
  return it == in_flight_.end() ? 0 : it->second;
}

size_t CallLimiter::clients() const {
  absl::MutexLock lock(&mu_);
  return in_flight_.size();
}

}  // namespace gcomp::server
