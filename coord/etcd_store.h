// Store (store.h) over etcd's v3 gRPC API (KV, Lease, Watch), with stubs generated from the
// .proto files Debian's etcd ships (third_party/etcd). Thread-safe.
//
// A store of several members is given every member's endpoint: a call goes to the member
// that answered last and, when that one does not answer (Unavailable, DeadlineExceeded),
// moves on to the next, each at most once per call. etcd forwards writes to its leader
// itself, and a member cut off from the quorum refuses them, so any member that answers is
// as good as another.
#ifndef GCOMP_COORD_ETCD_STORE_H_
#define GCOMP_COORD_ETCD_STORE_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coord/store.h"
#include "proto/cluster_config.pb.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace gcomp::coord {

struct EtcdStoreOptions {
  // host:port of each member's client URL (plain HTTP/2; etcd's TLS is not supported yet).
  std::vector<std::string> endpoints;
  // Bound on one request to one member (a watch's start, a get, a transaction...).
  absl::Duration request_timeout = absl::Seconds(2);
};

class EtcdStore final : public Store {
 public:
  // InvalidArgument naming the endpoint when the list is empty or one is not host:port.
  // Connects lazily: a store that is down now fails the first call, not this one.
  static absl::StatusOr<std::unique_ptr<EtcdStore>> Create(const EtcdStoreOptions& options);
  ~EtcdStore() override;

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

 private:
  struct Member;
  explicit EtcdStore(const EtcdStoreOptions& options);
  // One request's deadline: options_.request_timeout from now.
  void SetDeadline(grpc::ClientContext* ctx) const;
  // Runs `call` on the members in turn, from the last that answered, until one answers.
  absl::Status OnAnyMember(const std::function<absl::Status(Member&)>& call);

  const EtcdStoreOptions options_;
  std::vector<std::unique_ptr<Member>> members_;
  std::atomic<size_t> current_{0};
};

// The options a cluster config's `coordination` section gives (etcd members, request
// timeout).
EtcdStoreOptions EtcdStoreOptionsFrom(const proto::CoordinationConfig& coordination);

// The key range [prefix, end) that etcd's range_end means for "every key with this prefix".
std::string PrefixRangeEnd(const std::string& prefix);

}  // namespace gcomp::coord

#endif  // GCOMP_COORD_ETCD_STORE_H_
