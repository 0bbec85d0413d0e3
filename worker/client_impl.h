// Private to the client (worker/client*.cc): Client::Impl, the shard map a call runs under
// (MapState), and the retry and map-switch rules every call shares.
#ifndef GCOMP_WORKER_CLIENT_IMPL_H_
#define GCOMP_WORKER_CLIENT_IMPL_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/metrics_exposer.h"
#include "base/thread_cache.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "cluster/grpc_status.h"
#include "cluster/shard_map.h"
#include "cluster/wire_block.h"
#include "cluster/wire_message.h"
#include "grpcpp/grpcpp.h"
#include "proto/aggregation.grpc.pb.h"
#include "proto/reshard.grpc.pb.h"
#include "worker/client.h"
#include "worker/client_metrics.h"

namespace gcomp::worker {

using cluster::FromGrpc;

// Longest sleep between two retries of one call.
constexpr int64_t kMaxBackoffMs = 5000;
// Longest wait between two connection attempts to a shard: a shard that comes back (a
// restarted pod rejoining) is reached within a second.
constexpr int kMaxReconnectBackoffMs = 1000;

// How long one connection attempt to a shard, or one DNS lookup of its name, may take
// before gRPC gives it up: half of connect_timeout_ms, within [2 s, 20 s]. gRPC's own
// limits (20 s an attempt, 120 s a lookup) outlast the whole default connect_timeout_ms:
// one attempt whose packets are lost, or one DNS answer that never comes (the AAAA query
// of a name whose A record came at once, passed on by the DNS server to resolvers it cannot
// reach), would use up the caller's deadline. A lookup cut short keeps the addresses it has.
int ConnectAttemptMs(uint32_t connect_timeout_ms);

// The gRPC deadline `ms` milliseconds from now.
std::chrono::system_clock::time_point DeadlineIn(uint32_t ms);

struct TensorInfo {
  codec::DType dtype = codec::DType::kF32;
  cluster::ChunkLayout layout;
};

// A call is resent under a newer map (after a re-shard or a failover answered ABORTED), or
// after a replicated shard stayed unreachable, at most this many times.
constexpr int kMaxMapSwitches = 16;

// The shard map a call runs under: its config (shards, epoch) and stubs. Replaced, never
// changed, when a re-shard moves the job to a new map (docs/SERVICE.md, "Re-sharding").
struct MapState {
  proto::ClusterConfig config;
  cluster::ShardMap map{1, 1};
  uint32_t replicas = 1;
  std::vector<bool> down;     // by shard: taken out by a failover
  std::vector<bool> joining;  // by shard: back, catching up, owning nothing yet
  // One channel's stubs: the generated one, and PushPull without payload copies.
  struct Stubs {
    std::unique_ptr<proto::Aggregation::Stub> aggregation;
    std::unique_ptr<cluster::PushPullStub> push_pull;
  };
  // stubs[shard][channel] and one Resharding stub per shard.
  std::vector<std::vector<Stubs>> stubs;
  std::vector<std::unique_ptr<proto::Resharding::Stub>> reshard;

  uint64_t epoch() const { return config.shard_map_epoch(); }
  // Each chunk's live replica set, owner first (ShardMap::LiveReplicas).
  std::vector<uint32_t> Holders(const std::string& key, const TensorInfo& t) const;
  // Each chunk's owner; ShardMap::kNone when every shard that could hold it is down.
  std::vector<uint32_t> Owners(const std::string& key, const TensorInfo& t) const;
  // Why chunk `c` has no owner: its shards, all down.
  absl::Status NoOwner(const std::string& key, const TensorInfo& t, uint32_t c) const;
};

struct Client::Impl {
  // Fields other than `shards` and `shard_map_epoch` never change; those two live in the
  // current MapState.
  proto::ClusterConfig config;
  ClientOptions options;
  cluster::DirectionCodec uplink;
  // How pushes are checksummed: the fast kind until a shard registers without reading it
  // (a shard of an earlier version), XXH64 from then on.
  std::atomic<proto::ChecksumKind> push_checksum{cluster::kFastChecksum};
  std::unique_ptr<cluster::ClientSecurity> security;
  std::atomic<uint64_t> next_channel{0};

  mutable absl::Mutex map_mu;
  std::shared_ptr<const MapState> map ABSL_GUARDED_BY(map_mu);
  // Channels by address, reused by later maps.
  std::map<std::string, std::vector<std::shared_ptr<grpc::Channel>>> channels ABSL_GUARDED_BY(map_mu);
  absl::Mutex switch_mu;  // one map switch at a time

  mutable absl::Mutex mu;
  absl::flat_hash_map<std::string, TensorInfo> tensors ABSL_GUARDED_BY(mu);

  std::atomic<uint64_t> raw_sent{0}, raw_received{0}, wire_sent{0}, wire_received{0};
  std::atomic<uint64_t> chunks{0}, retries{0};
  std::atomic<uint64_t> map_switches{0};
  std::atomic<uint64_t> down_reports{0};

  ClientStats Stats() const;
  // Null without ClientOptions::metrics_address. The exposer is declared last so that it
  // stops serving before the metrics it reads go away.
  std::shared_ptr<ClientMetrics> metrics;
  std::unique_ptr<MetricsExposer> metrics_exposer;
  // Runs PushPullAsync calls and the chunk senders of every PushPull: threads are reused
  // across steps instead of started per call. Last, so that it is destroyed first: calls
  // still running finish while everything they use is alive.
  ThreadCache threads;

  // The current map.
  std::shared_ptr<const MapState> Map() const;

  // The stubs of one of `shard`'s channels in `m`, taken in turn.
  const MapState::Stubs* Stub(const MapState& m, uint32_t shard);

  // A MapState for `config` (its shards and epoch), with channels reused by address.
  std::shared_ptr<MapState> BuildMap(const proto::ClusterConfig& config);
  // Registers this worker with every shard of `m`; each call waits up to timeout_ms for
  // the shard to be reachable and to serve `m`.
  // `connecting`: Client::Connect's first registration, whose timeout is connect_timeout_ms
  // and whose likely cause of silence is a shard not running (a map switch waits longer
  // for shards that do run).
  // `unreachable`, when set, gets the shard that did not answer (kNone otherwise).
  absl::Status RegisterAll(const MapState& m, uint32_t timeout_ms, bool connecting,
                           uint32_t* unreachable = nullptr);
  // Declares `key` on every shard of `m`; `initial` as in Client::Declare.
  // `may_switch`: a shard answering ABORTED moves this client to the newer map and the
  // declaration is redone there (else the ABORTED status is returned).
  absl::Status DeclareOn(const MapState& m, const std::string& key, const TensorInfo& t,
                         size_t elements, const void* initial, bool may_switch = true);
  // After shard `shard` of `seen` answered ABORTED, or could not be reached: fetches the
  // config from it, else from the other shards, and moves this client to a newer map
  // (registered, every tensor declared), unless another call already did. NotFound when
  // no shard knows a newer map. With replicas, a shard of the new map that does not answer
  // (it died after that map was made) is reported, and the failover's next map is waited
  // for, up to rpc_timeout_ms; `wait`: how long to wait for a newer map at all (0: none
  // when no shard knows one).
  absl::Status SwitchMap(const MapState& seen, uint32_t shard,
                         absl::Duration wait = absl::ZeroDuration());
  // The newest map a live shard of `seen` serves above epoch `floor` (asking `shard`
  // first) into *next, and who served it into *from; NotFound when none does.
  absl::Status FindNewerMap(const MapState& seen, uint32_t shard, uint64_t floor,
                            proto::ClusterConfig* next, std::string* from);
  // Whether a failed call should be resent under a newer map: ABORTED always (an error
  // if none can be found), UNAVAILABLE when a shard knows one (a shard a re-shard
  // removed may already be stopped). Fills *error when the call should fail.
  bool ResendAfterSwitch(const grpc::Status& st, const MapState& seen, uint32_t shard,
                         absl::Status* error);

  // Tells the first other live shard that answers that `shard` of `seen` is unreachable.
  void ReportDown(const MapState& seen, uint32_t shard, const std::string& why);

  // The declared tensor `key`; NotFound if this client has not declared it.
  absl::StatusOr<TensorInfo> Find(const std::string& key) const;

  // One unary call, retried on UNAVAILABLE, CANCELLED and busy refusals
  // (cluster::IsBusyRefusal);
  // with `map`, not once this client has moved past it (the shard may be one a re-shard
  // removed and stopped).
  grpc::Status WithRetries(absl::FunctionRef<grpc::Status()> call,
                           const MapState* map = nullptr);

  // One unary call to `shard` of map `m` with the config's call deadline, retried as
  // WithRetries does. `rpc(stub, context)` makes the call.
  grpc::Status CallShard(
      const MapState& m, uint32_t shard,
      absl::FunctionRef<grpc::Status(const MapState::Stubs*, grpc::ClientContext*)> rpc);

  absl::Status RunPushPull(const std::string& key, int64_t step, const void* input, void* output);

  // A chunk's last completed step is below 2^62 (the shard's limit): ResumeStep adds 1.
  static constexpr int64_t kMaxResumableStep = int64_t{1} << 62;
  // Chunk c's current value from its shard (Pull, with retries).
  absl::StatusOr<proto::CompressedBlock> PullChunk(const std::string& key, const TensorInfo& t,
                                                   uint32_t c);
};

}  // namespace gcomp::worker

#endif  // GCOMP_WORKER_CLIENT_IMPL_H_
