#include "coord/memory_store.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gcomp::coord {

class MemoryStore::MemoryWatch final : public Watch {
 public:
  MemoryWatch(MemoryStore* store, std::string prefix, std::function<void(const WatchEvent&)> on_event)
      : store_(store), prefix_(std::move(prefix)), on_event_(std::move(on_event)) {}
  ~MemoryWatch() override {
    absl::MutexLock l(&store_->watch_mu_);
    store_->watches_.erase(this);
  }
  void Offer(const WatchEvent& e) const {
    if (absl::StartsWith(e.kv.key, prefix_)) on_event_(e);
  }

 private:
  MemoryStore* const store_;
  const std::string prefix_;
  const std::function<void(const WatchEvent&)> on_event_;
};

MemoryStore::~MemoryStore() = default;

absl::Status MemoryStore::Reachable() const {
  if (unreachable_) return absl::UnavailableError("memory store: unreachable (injected)");
  return absl::OkStatus();
}

absl::StatusOr<std::optional<KeyValue>> MemoryStore::Get(const std::string& key) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = Reachable(); !s.ok()) return s;
  auto it = kvs_.find(key);
  if (it == kvs_.end()) return std::optional<KeyValue>();
  return std::optional<KeyValue>(it->second);
}

absl::StatusOr<std::vector<KeyValue>> MemoryStore::GetPrefix(const std::string& prefix) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = Reachable(); !s.ok()) return s;
  std::vector<KeyValue> out;
  for (auto it = kvs_.lower_bound(prefix); it != kvs_.end() && absl::StartsWith(it->first, prefix);
       ++it) {
    out.push_back(it->second);
  }
  return out;
}

void MemoryStore::DeleteLocked(const std::string& key, std::vector<WatchEvent>* events) {
  auto it = kvs_.find(key);
  if (it == kvs_.end()) return;
  if (it->second.lease != kNoLease) {
    auto l = leases_.find(it->second.lease);
    if (l != leases_.end()) l->second.keys.erase(key);
  }
  WatchEvent e;
  e.type = WatchEvent::Type::kDelete;
  e.kv.key = key;
  e.kv.mod_revision = revision_;
  kvs_.erase(it);
  history_.push_back(e);
  events->push_back(e);
}

absl::StatusOr<TxnResult> MemoryStore::Commit(const Txn& txn) {
  std::vector<WatchEvent> events;
  TxnResult out;
  {
    absl::MutexLock l(&mu_);
    if (absl::Status s = Reachable(); !s.ok()) return s;
    bool ok = true;
    for (const Condition& c : txn.conditions) {
      auto it = kvs_.find(c.key);
      const int64_t have = it == kvs_.end() ? 0
                           : c.field == Condition::Field::kModRevision ? it->second.mod_revision
                                                                        : it->second.create_revision;
      ok = ok && have == c.revision;
    }
    for (const Put& p : txn.puts) {
      if (p.lease != kNoLease && !leases_.count(p.lease)) {
        return absl::NotFoundError(absl::StrCat("memory store: lease ", p.lease, " not found"));
      }
    }
    out.committed = ok;
    if (ok && (!txn.puts.empty() || !txn.deletes.empty())) {
      ++revision_;
      for (const Put& p : txn.puts) {
        KeyValue& kv = kvs_[p.key];
        if (kv.create_revision == 0) kv.create_revision = revision_;
        if (kv.lease != kNoLease && kv.lease != p.lease) {
          auto old = leases_.find(kv.lease);
          if (old != leases_.end()) old->second.keys.erase(p.key);
        }
        kv.key = p.key;
        kv.value = p.value;
        kv.mod_revision = revision_;
        kv.lease = p.lease;
        if (p.lease != kNoLease) leases_[p.lease].keys.insert(p.key);
        WatchEvent e;
        e.kv = kv;
        history_.push_back(e);
        events.push_back(e);
      }
      for (const std::string& key : txn.deletes) DeleteLocked(key, &events);
    }
    out.revision = revision_;
  }
  Deliver(events);
  return out;
}

absl::StatusOr<LeaseId> MemoryStore::GrantLease(absl::Duration ttl) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = Reachable(); !s.ok()) return s;
  const absl::Duration whole = absl::Ceil(std::max(ttl, absl::Seconds(1)), absl::Seconds(1));
  const LeaseId id = next_lease_++;
  leases_[id] = Lease{whole, now_ + whole, {}};
  return id;
}

absl::StatusOr<absl::Duration> MemoryStore::KeepAlive(LeaseId lease) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = Reachable(); !s.ok()) return s;
  auto it = leases_.find(lease);
  if (it == leases_.end()) return absl::NotFoundError(absl::StrCat("lease ", lease, " expired"));
  it->second.expires_at = now_ + it->second.ttl;
  return it->second.ttl;
}

void MemoryStore::ExpireLocked(LeaseId lease, std::vector<WatchEvent>* events) {
  auto it = leases_.find(lease);
  if (it == leases_.end()) return;
  const std::set<std::string> keys = std::move(it->second.keys);
  leases_.erase(it);
  if (keys.empty()) return;
  ++revision_;
  for (const std::string& key : keys) DeleteLocked(key, events);
}

absl::Status MemoryStore::Revoke(LeaseId lease) {
  std::vector<WatchEvent> events;
  {
    absl::MutexLock l(&mu_);
    if (absl::Status s = Reachable(); !s.ok()) return s;
    ExpireLocked(lease, &events);
  }
  Deliver(events);
  return absl::OkStatus();
}

void MemoryStore::ExpireLease(LeaseId lease) {
  std::vector<WatchEvent> events;
  {
    absl::MutexLock l(&mu_);
    ExpireLocked(lease, &events);
  }
  Deliver(events);
}

void MemoryStore::Advance(absl::Duration d) {
  std::vector<WatchEvent> events;
  {
    absl::MutexLock l(&mu_);
    now_ += d;
    std::vector<LeaseId> expired;
    for (const auto& [id, lease] : leases_) {
      if (lease.expires_at <= now_) expired.push_back(id);
    }
    for (LeaseId id : expired) ExpireLocked(id, &events);
  }
  Deliver(events);
}

void MemoryStore::SetUnreachable(bool unreachable) {
  absl::MutexLock l(&mu_);
  unreachable_ = unreachable;
}

int64_t MemoryStore::revision() const {
  absl::MutexLock l(&mu_);
  return revision_;
}

void MemoryStore::Deliver(const std::vector<WatchEvent>& events) {
  if (events.empty()) return;
  absl::MutexLock order(&deliver_mu_);
  absl::MutexLock l(&watch_mu_);
  for (const WatchEvent& e : events) {
    for (MemoryWatch* w : watches_) w->Offer(e);
  }
}

absl::StatusOr<std::unique_ptr<Watch>> MemoryStore::WatchPrefix(
    const std::string& prefix, int64_t after_revision,
    std::function<void(const WatchEvent&)> on_event,
    std::function<void(const absl::Status&)> on_error) {
  auto w = std::make_unique<MemoryWatch>(this, prefix, std::move(on_event));
  // Replay and registration under the delivery lock: no change is missed or seen twice.
  absl::MutexLock order(&deliver_mu_);
  std::vector<WatchEvent> replay;
  {
    absl::MutexLock l(&mu_);
    if (absl::Status s = Reachable(); !s.ok()) return s;
    for (const WatchEvent& e : history_) {
      if (e.kv.mod_revision > after_revision) replay.push_back(e);
    }
  }
  for (const WatchEvent& e : replay) w->Offer(e);
  absl::MutexLock l(&watch_mu_);
  watches_.insert(w.get());
  return std::unique_ptr<Watch>(std::move(w));
}

}  // namespace gcomp::coord
