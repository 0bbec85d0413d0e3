// Private to the client (worker/client*.cc): Client::Impl, the shard map a call runs under
// (MapState), and the retry and map-switch rules every call shares.
#ifndef GCOMP_WORKER_CLIENT_IMPL_H_
#define GCOMP_WORKER_CLIENT_IMPL_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
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
inline int ConnectAttemptMs(uint32_t connect_timeout_ms) {
  return static_cast<int>(std::clamp<uint32_t>(connect_timeout_ms / 2, 2000, 20000));
}

inline std::chrono::system_clock::time_point DeadlineIn(uint32_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

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
  std::vector<uint32_t> Holders(const std::string& key, const TensorInfo& t) const {
    return map.LiveReplicas(key, t.layout, replicas, down, joining);
  }
  // Each chunk's owner; ShardMap::kNone when every shard that could hold it is down.
  std::vector<uint32_t> Owners(const std::string& key, const TensorInfo& t) const {
    if (replicas == 1) return map.Assign(key, t.layout);  // the common case, without ranking
    const std::vector<uint32_t> live = Holders(key, t);
    std::vector<uint32_t> owner(t.layout.num_chunks);
    for (size_t c = 0; c < owner.size(); ++c) owner[c] = live[c * replicas];
    return owner;
  }
  // Why chunk `c` has no owner: its shards, all down.
  absl::Status NoOwner(const std::string& key, const TensorInfo& t, uint32_t c) const {
    const std::vector<uint32_t> all = map.LiveReplicas(key, t.layout, replicas, {});
    std::vector<std::string> names;
    for (uint32_t j = 0; j < replicas; ++j) {
      const uint32_t k = all[c * replicas + j];
      names.push_back(absl::StrCat("shard ", k, " (", config.shards(k), ")"));
    }
    return absl::UnavailableError(absl::StrCat("chunk ", c, " of '", key, "': its shards ",
                                               absl::StrJoin(names, " and "),
                                               " and every other shard are down"));
  }
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

  ClientStats Stats() const {
    ClientStats s;
    s.raw_bytes_sent = raw_sent;
    s.raw_bytes_received = raw_received;
    s.wire_bytes_sent = wire_sent;
    s.wire_bytes_received = wire_received;
    s.chunks = chunks;
    s.retries = retries;
    s.map_switches = map_switches;
    s.down_reports = down_reports;
    return s;
  }
  // Null without ClientOptions::metrics_address. The exposer is declared last so that it
  // stops serving before the metrics it reads go away.
  std::shared_ptr<ClientMetrics> metrics;
  std::unique_ptr<MetricsExposer> metrics_exposer;
  // Runs PushPullAsync calls and the chunk senders of every PushPull: threads are reused
  // across steps instead of started per call. Last, so that it is destroyed first: calls
  // still running finish while everything they use is alive.
  ThreadCache threads;

  std::shared_ptr<const MapState> Map() const {
    absl::MutexLock lock(&map_mu);
    return map;
  }

  const MapState::Stubs* Stub(const MapState& m, uint32_t shard) {
    auto& v = m.stubs[shard];
    return &v[next_channel.fetch_add(1, std::memory_order_relaxed) % v.size()];
  }

  // A MapState for `config` (its shards and epoch), with channels reused by address.
  std::shared_ptr<MapState> BuildMap(const proto::ClusterConfig& config);
  // Registers this worker with every shard of `m`; each call waits up to timeout_ms for
  // the shard to be reachable and to serve `m`.
  // `connecting`: Client::Connect's first registration, whose timeout is connect_timeout_ms
  // and whose likely cause of silence is a shard not running (a map switch waits longer
  // for shards that do run).
  absl::Status RegisterAll(const MapState& m, uint32_t timeout_ms, bool connecting);
  // Declares `key` on every shard of `m`; `initial` as in Client::Declare.
  // `may_switch`: a shard answering ABORTED moves this client to the newer map and the
  // declaration is redone there (else the ABORTED status is returned).
  absl::Status DeclareOn(const MapState& m, const std::string& key, const TensorInfo& t,
                         size_t elements, const void* initial, bool may_switch = true);
  // After shard `shard` of `seen` answered ABORTED, or could not be reached: fetches the
  // config from it, else from the other shards, and moves this client to a newer map
  // (registered, every tensor declared), unless another call already did. NotFound when
  // no shard knows a newer map.
  absl::Status SwitchMap(const MapState& seen, uint32_t shard);
  // Whether a failed call should be resent under a newer map: ABORTED always (an error
  // if none can be found), UNAVAILABLE when a shard knows one (a shard a re-shard
  // removed may already be stopped). Fills *error when the call should fail.
  bool ResendAfterSwitch(const grpc::Status& st, const MapState& seen, uint32_t shard,
                         absl::Status* error) {
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED && seen.replicas > 1) {
      // No answer in rpc_timeout_ms: the shard may be paused or cut off, and failed over
      // meanwhile (its lease ended). Resent only under a newer map: a step that timed out
      // on a shard that still serves fails as before.
      ReportDown(seen, shard, st.error_message());
      return SwitchMap(seen, shard).ok();
    }
    const bool aborted = st.error_code() == grpc::StatusCode::ABORTED;
    if (!aborted && st.error_code() != grpc::StatusCode::UNAVAILABLE) return false;
    // With replicas, a shard that stays unreachable is reported, so that its backups take
    // its chunks over (docs/SERVICE.md, "Replication and failover").
    if (!aborted && seen.replicas > 1) ReportDown(seen, shard, st.error_message());
    absl::Status s = SwitchMap(seen, shard);
    if (s.ok()) return true;
    if (!aborted && seen.replicas > 1 && absl::IsNotFound(s)) {
      // Every shard answered the probe, so this one is back (a restart, catching up): its
      // rejoin brings a new map soon. Try again (the caller bounds the rounds).
      absl::SleepFor(absl::Milliseconds(500));
      return true;
    }
    if (aborted || !absl::IsNotFound(s)) *error = s;
    return false;
  }

  // Tells the first other live shard that answers that `shard` of `seen` is unreachable.
  void ReportDown(const MapState& seen, uint32_t shard, const std::string& why) {
    proto::ReportDownRequest req;
    req.set_job(config.job());
    req.set_shard_map_epoch(seen.epoch());
    req.set_shard(shard);
    req.set_reason(absl::StrCat(options.name, ": ", why));
    for (uint32_t k = 0; k < seen.stubs.size(); ++k) {
      if (k == shard || seen.down[k]) continue;
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(30000));
      proto::ReportDownResponse resp;
      if (seen.reshard[k]->ReportDown(&ctx, req, &resp).ok()) {
        ++down_reports;
        return;
      }
    }
  }

  absl::StatusOr<TensorInfo> Find(const std::string& key) const {
    absl::MutexLock lock(&mu);
    auto it = tensors.find(key);
    if (it == tensors.end()) {
      return absl::NotFoundError(absl::StrCat("tensor '", key, "' not declared on this client"));
    }
    return it->second;
  }

  // One unary call, retried on UNAVAILABLE, CANCELLED and busy refusals
  // (cluster::IsBusyRefusal);
  // with `map`, not once this client has moved past it (the shard may be one a re-shard
  // removed and stopped).
  template <typename Call>
  grpc::Status WithRetries(Call&& call, const MapState* map = nullptr) {
    grpc::Status s;
    for (uint32_t attempt = 0;; ++attempt) {
      s = call();
      if (map != nullptr && !s.ok() && Map()->epoch() > map->epoch()) return s;
      // UNAVAILABLE: the shard could not be reached. CANCELLED: the shard dropped the call
      // (e.g. while draining for shutdown); this client never cancels its own calls. Both
      // are safe to retry, since pushes are idempotent on the shard.
      const bool retryable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             s.error_code() == grpc::StatusCode::CANCELLED ||
                             cluster::IsBusyRefusal(s);
      if (!retryable || attempt >= config.max_retries()) return s;
      ++retries;
      const int64_t backoff_ms =
          std::min<int64_t>(int64_t{config.retry_backoff_ms()} << std::min(attempt, 10u), kMaxBackoffMs);
      absl::SleepFor(absl::Milliseconds(backoff_ms));
    }
  }

  // One unary call to `shard` of map `m` with the config's call deadline, retried as
  // WithRetries does. `rpc(stub, context)` makes the call.
  template <typename Rpc>
  grpc::Status CallShard(const MapState& m, uint32_t shard, Rpc&& rpc) {
    return WithRetries([&] {
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(config.rpc_timeout_ms()));
      return rpc(Stub(m, shard), &ctx);
    }, &m);
  }

  absl::Status RunPushPull(const std::string& key, int64_t step, const void* input, void* output);

  // A chunk's last completed step is below 2^62 (the shard's limit): ResumeStep adds 1.
  static constexpr int64_t kMaxResumableStep = int64_t{1} << 62;
  // Chunk c's current value from its shard (Pull, with retries).
  absl::StatusOr<proto::CompressedBlock> PullChunk(const std::string& key, const TensorInfo& t,
                                                   uint32_t c) {
    for (int switches = 0;; ++switches) {
      std::shared_ptr<const MapState> m = Map();
      const uint32_t shard = m->Owners(key, t)[c];
      if (shard == cluster::ShardMap::kNone) return m->NoOwner(key, t, c);
      proto::PullRequest req;
      req.set_job(config.job());
      req.set_key(key);
      req.set_chunk(c);
      req.set_shard_map_epoch(m->epoch());
      req.add_checksums_read(cluster::kFastChecksum);
      proto::CompressedBlock resp;
      grpc::Status st = CallShard(*m, shard, [&](auto* stub, grpc::ClientContext* ctx) {
        return stub->aggregation->Pull(ctx, req, &resp);
      });
      absl::Status error;
      if (!st.ok() && switches < kMaxMapSwitches && ResendAfterSwitch(st, *m, shard, &error)) continue;
      if (!error.ok()) return error;
      if (!st.ok()) return FromGrpc(st, absl::StrCat("pull of '", key, "' chunk ", c));
      // As for push-pull: a reply for another chunk (or a step no chunk can be at) from a
      // broken or hostile shard is refused, not decoded into the output.
      const proto::BlockAddress& got = resp.address();
      if (got.key() != key || got.chunk() != c || got.step() < -1 ||
          got.step() >= kMaxResumableStep) {
        return absl::InternalError(absl::StrCat(
            "pull of '", key, "' chunk ", c, " on shard ", shard, " (", m->config.shards(shard),
            "): reply addressed to '", got.key(), "' chunk ", got.chunk(), " step ", got.step()));
      }
      return resp;
    }
  }
};

}  // namespace gcomp::worker

#endif  // GCOMP_WORKER_CLIENT_IMPL_H_
