// Store (store.h) in this process's memory, with the same revision, lease and watch rules as
// etcd: the fake that unit tests of the code above the store use. Leases expire only when
// the test says so (ExpireLease) or when their TTL passes on the clock the test advances
// (Advance). Thread-safe; a watch callback must not destroy a watch of the same store.
#ifndef GCOMP_COORD_MEMORY_STORE_H_
#define GCOMP_COORD_MEMORY_STORE_H_

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "coord/store.h"

namespace gcomp::coord {

class MemoryStore final : public Store {
 public:
  MemoryStore() = default;
  ~MemoryStore() override;

  absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key) override;
  absl::StatusOr<std::vector<KeyValue>> GetPrefix(const std::string& prefix) override;
  absl::StatusOr<TxnResult> Commit(const Txn& txn) override;
  absl::StatusOr<LeaseId> GrantLease(absl::Duration ttl) override;
  absl::StatusOr<absl::Duration> KeepAlive(LeaseId lease) override;
  absl::Status Revoke(LeaseId lease) override;
  absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(
      const std::string& prefix, int64_t after_revision,
      std::function<void(const WatchEvent&)> on_event,
      std::function<void(const absl::Status&)> on_error) override;

  // Faults: the lease expires now (its keys are deleted, watchers told); every call fails
  // with Unavailable while unreachable (as a partition from the store looks).
  void ExpireLease(LeaseId lease) ABSL_LOCKS_EXCLUDED(mu_);
  void SetUnreachable(bool unreachable) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the store's clock on: leases not renewed within their TTL expire.
  void Advance(absl::Duration d) ABSL_LOCKS_EXCLUDED(mu_);
  int64_t revision() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class MemoryWatch;
  struct Lease {
    absl::Duration ttl;
    absl::Duration expires_at;  // on the store's clock
    std::set<std::string> keys;
  };
  absl::Status Reachable() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void DeleteLocked(const std::string& key, std::vector<WatchEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ExpireLocked(LeaseId lease, std::vector<WatchEvent>* events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Delivers `events` to the watches, outside mu_ (a callback may call the store).
  void Deliver(const std::vector<WatchEvent>& events) ABSL_LOCKS_EXCLUDED(mu_, watch_mu_);

  mutable absl::Mutex mu_;
  std::map<std::string, KeyValue> kvs_ ABSL_GUARDED_BY(mu_);
  std::vector<WatchEvent> history_ ABSL_GUARDED_BY(mu_);  // every change, for watches' replay
  std::map<LeaseId, Lease> leases_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 1;
  LeaseId next_lease_ ABSL_GUARDED_BY(mu_) = 1000;
  absl::Duration now_ ABSL_GUARDED_BY(mu_);
  bool unreachable_ ABSL_GUARDED_BY(mu_) = false;

  // Watches are told in order of changes: one delivery at a time.
  absl::Mutex deliver_mu_;
  mutable absl::Mutex watch_mu_;
  std::set<MemoryWatch*> watches_ ABSL_GUARDED_BY(watch_mu_);
};

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_MEMORY_STORE_H_
