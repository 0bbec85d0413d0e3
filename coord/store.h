// The narrow interface to the consensus store that holds the cluster's state (the shard-map
// record, the shards' leases, the coordinator's key): get, conditional transaction, lease,
// watch, and nothing else, as etcd's own clients expose it. EtcdStore (etcd_store.h) is the
// implementation; a Kubernetes-API backend would be another.
//
// Revisions are the store's: every committed change raises the store-wide revision, and each
// key carries the revision of its last change (mod_revision) and of its creation
// (create_revision); 0 means "absent". A transaction conditioned on mod_revision is a
// compare-and-swap: of two writers that read the same revision, exactly one commits.
#ifndef GCOMP_COORD_STORE_H_
#define GCOMP_COORD_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace gcomp::coord {

// A lease id; kNoLease for keys that live until deleted.
using LeaseId = int64_t;
inline constexpr LeaseId kNoLease = 0;

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  LeaseId lease = kNoLease;
};

// What a transaction requires of a key before it writes anything.
struct Condition {
  enum class Field { kModRevision, kCreateRevision };
  std::string key;
  Field field = Field::kModRevision;
  // The revision the key must have; 0: the key must be absent.
  int64_t revision = 0;
};

struct Put {
  std::string key;
  std::string value;
  LeaseId lease = kNoLease;  // the key is deleted when this lease expires or is revoked
};

// All of `puts` and `deletes` happen at once, and only if every condition holds.
struct Txn {
  std::vector<Condition> conditions;
  std::vector<Put> puts;
  std::vector<std::string> deletes;
};

struct TxnResult {
  bool committed = false;  // false: a condition failed and nothing was written
  int64_t revision = 0;    // the store's revision after the transaction
};

struct WatchEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: the key and the revision of the deletion (mod_revision)
};

// A running watch; destroying it stops the watch and waits until no callback runs.
class Watch {
 public:
  virtual ~Watch() = default;
};

class Store {
 public:
  virtual ~Store() = default;

  // The key's value, or nullopt when it does not exist. Every call may fail with
  // Unavailable or DeadlineExceeded when no member of the store answers.
  virtual absl::StatusOr<std::optional<KeyValue>> Get(const std::string& key) = 0;
  // Every key that starts with `prefix`, in key order.
  virtual absl::StatusOr<std::vector<KeyValue>> GetPrefix(const std::string& prefix) = 0;
  virtual absl::StatusOr<TxnResult> Commit(const Txn& txn) = 0;

  // A lease that expires `ttl` after its last renewal (the store rounds up to whole seconds).
  virtual absl::StatusOr<LeaseId> GrantLease(absl::Duration ttl) = 0;
  // Renews the lease; the TTL it now has. NotFound when it already expired.
  virtual absl::StatusOr<absl::Duration> KeepAlive(LeaseId lease) = 0;
  // Ends the lease and deletes its keys; OK when it had already expired.
  virtual absl::Status Revoke(LeaseId lease) = 0;

  // Calls `on_event` with every change to a key starting with `prefix` made after the store's
  // revision `after_revision`, in revision order, from a thread of the watch's own. When the
  // watch breaks for good (the store compacted past it, or no member answers for longer than
  // the store's request timeout) `on_error` is called once and no event follows: read again
  // and start a new watch.
  virtual absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(
      const std::string& prefix, int64_t after_revision,
      std::function<void(const WatchEvent&)> on_event,
      std::function<void(const absl::Status&)> on_error) = 0;
};

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_STORE_H_
