#include "worker/client.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/aggregation.grpc.pb.h"
#include "proto/reshard.grpc.pb.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "cluster/grpc_status.h"
#include "cluster/shard_map.h"
#include "cluster/wire_block.h"
#include "gpu/runtime.h"
#include "worker/device_chunks.h"
#include "base/metrics_exposer.h"
#include "worker/client_metrics.h"

namespace gcomp::worker {
namespace {

using cluster::FromGrpc;

// Longest sleep between two retries of one call.
constexpr int64_t kMaxBackoffMs = 5000;
// Longest wait between two connection attempts to a shard: a shard that comes back (a
// restarted pod rejoining) is reached within a second.
constexpr int kMaxReconnectBackoffMs = 1000;

std::chrono::system_clock::time_point DeadlineIn(uint32_t ms) {
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
  // stubs[shard][channel] and one Resharding stub per shard.
  std::vector<std::vector<std::unique_ptr<proto::Aggregation::Stub>>> stubs;
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

}  // namespace

struct Client::Impl {
  // Fields other than `shards` and `shard_map_epoch` never change; those two live in the
  // current MapState.
  proto::ClusterConfig config;
  ClientOptions options;
  cluster::DirectionCodec uplink;
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

  std::shared_ptr<const MapState> Map() const {
    absl::MutexLock lock(&map_mu);
    return map;
  }

  proto::Aggregation::Stub* Stub(const MapState& m, uint32_t shard) {
    auto& v = m.stubs[shard];
    return v[next_channel.fetch_add(1, std::memory_order_relaxed) % v.size()].get();
  }

  // A MapState for `config` (its shards and epoch), with channels reused by address.
  std::shared_ptr<MapState> BuildMap(const proto::ClusterConfig& config);
  // Registers this worker with every shard of `m`.
  absl::Status RegisterAll(const MapState& m, bool wait_for_ready);
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

  // One unary call, retried on UNAVAILABLE and CANCELLED; with `map`, not once this client
  // has moved past it (the shard may be one a re-shard removed and stopped).
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
                             s.error_code() == grpc::StatusCode::CANCELLED;
      if (!retryable || attempt >= config.max_retries()) return s;
      ++retries;
      const int64_t backoff_ms =
          std::min<int64_t>(int64_t{config.retry_backoff_ms()} << std::min(attempt, 10u), kMaxBackoffMs);
      absl::SleepFor(absl::Milliseconds(backoff_ms));
    }
  }

  absl::Status RunPushPull(const std::string& key, int64_t step, const void* input, void* output);

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
      proto::CompressedBlock resp;
      grpc::Status st = WithRetries([&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineIn(config.rpc_timeout_ms()));
        return Stub(*m, shard)->Pull(&ctx, req, &resp);
      }, m.get());
      absl::Status error;
      if (!st.ok() && switches < kMaxMapSwitches && ResendAfterSwitch(st, *m, shard, &error)) continue;
      if (!error.ok()) return error;
      if (!st.ok()) return FromGrpc(st, absl::StrCat("pull of '", key, "' chunk ", c));
      return resp;
    }
  }
};

std::shared_ptr<MapState> Client::Impl::BuildMap(const proto::ClusterConfig& cfg) {
  auto m = std::make_shared<MapState>();
  m->config = cfg;
  m->map = cluster::ShardMap(cfg.shards_size(), cfg.shard_map_epoch());
  m->replicas = cluster::Replicas(cfg);
  m->down.assign(cfg.shards_size(), false);
  for (uint32_t k : cfg.down_shards()) m->down[k] = true;
  m->joining.assign(cfg.shards_size(), false);
  for (uint32_t k : cfg.joining_shards()) m->joining[k] = true;
  absl::MutexLock lock(&map_mu);
  for (int s = 0; s < cfg.shards_size(); ++s) {
    std::vector<std::shared_ptr<grpc::Channel>>& chans = channels[cfg.shards(s)];
    for (uint32_t c = chans.size(); c < cfg.channels_per_shard(); ++c) {
      grpc::ChannelArguments args;
      args.SetInt("gcomp.channel_index", static_cast<int>(c));  // distinct connections
      // Reconnect on the retry schedule: gRPC's default first reconnect waits about 1 s,
      // longer than a short retry budget, so a shard that comes back would be missed.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, static_cast<int>(cfg.retry_backoff_ms()));
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
      args.SetMaxReceiveMessageSize(static_cast<int>(cfg.max_message_bytes()));
      args.SetMaxSendMessageSize(static_cast<int>(cfg.max_message_bytes()));
      chans.push_back(security->NewChannel(cfg.shards(s), args));
    }
    m->stubs.emplace_back();
    for (const auto& channel : chans) m->stubs.back().push_back(proto::Aggregation::NewStub(channel));
    m->reshard.push_back(proto::Resharding::NewStub(chans[0]));
  }
  return m;
}

absl::Status Client::Impl::RegisterAll(const MapState& m, bool wait_for_ready) {
  proto::RegisterWorkerRequest req;
  req.set_job(config.job());
  req.set_worker(options.worker);
  req.set_name(options.name);
  req.set_shard_map_epoch(m.epoch());
  for (int s = 0; s < m.config.shards_size(); ++s) {
    if (m.down[s]) continue;  // failed over: its chunks are served by others
    for (const auto& stub : m.stubs[s]) {
      proto::RegisterWorkerResponse resp;
      grpc::Status st = WithRetries([&] {
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(wait_for_ready);
        ctx.set_deadline(DeadlineIn(wait_for_ready ? config.connect_timeout_ms() : config.rpc_timeout_ms()));
        return stub->RegisterWorker(&ctx, req, &resp);
      });
      if (!st.ok()) {
        return FromGrpc(st, absl::StrCat("registering with shard ", s, " (", m.config.shards(s), ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::SwitchMap(const MapState& seen, uint32_t shard) {
  absl::MutexLock switching(&switch_mu);
  if (Map()->epoch() > seen.epoch()) return absl::OkStatus();  // another call switched
  uint64_t floor = seen.epoch();
  // Maps can follow each other quickly (a failover, then a rejoin): a map replaced while
  // this client registers with it is skipped for the newer one.
  for (int attempt = 0;; ++attempt) {
    proto::ClusterConfig next;
    std::string from;
    std::vector<std::string> problems;
    const uint32_t n = seen.config.shards_size();
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t k = (shard + i) % n;
      if (seen.down[k]) continue;
      grpc::ClientContext ctx;
      ctx.set_deadline(DeadlineIn(std::min<uint32_t>(config.rpc_timeout_ms(), 5000)));
      proto::ClusterConfig got;
      grpc::Status st = seen.reshard[k]->GetConfig(&ctx, proto::GetConfigRequest(), &got);
      const std::string who = absl::StrCat("shard ", k, " (", seen.config.shards(k), ")");
      if (!st.ok()) {
        problems.push_back(absl::StrCat(who, ": ", st.error_message()));
      } else if (got.job() != config.job()) {
        problems.push_back(absl::StrCat(who, " serves job '", got.job(), "'"));
      } else if (got.shard_map_epoch() > floor &&
                 got.shard_map_epoch() > next.shard_map_epoch()) {
        next = std::move(got);
        from = who;
      }
    }
    if (from.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "no shard of shard-map epoch ", seen.epoch(), " knows a newer map",
          problems.empty() ? "" : absl::StrCat(" (", absl::StrJoin(problems, "; "), ")")));
    }
    // The worker keeps its own settings; only the map comes from the shard.
    proto::ClusterConfig cfg = seen.config;
    *cfg.mutable_shards() = next.shards();
    cfg.set_shard_map_epoch(next.shard_map_epoch());
    *cfg.mutable_down_shards() = next.down_shards();
    *cfg.mutable_joining_shards() = next.joining_shards();
    if (absl::Status s = cluster::ValidateReshard(seen.config, cfg); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("new shard map from ", from, ": ", s.message()));
    }
    std::shared_ptr<MapState> m = BuildMap(cfg);
    absl::Status s = RegisterAll(*m, /*wait_for_ready=*/true);
    absl::flat_hash_map<std::string, TensorInfo> declared;
    {
      absl::MutexLock lock(&mu);
      declared = tensors;
    }
    for (auto it = declared.begin(); s.ok() && it != declared.end(); ++it) {
      s = DeclareOn(*m, it->first, it->second, it->second.layout.elements, nullptr,
                    /*may_switch=*/false);
    }
    if (absl::IsAborted(s) && attempt < kMaxMapSwitches) {
      floor = m->epoch();
      continue;
    }
    if (!s.ok()) return s;
    absl::MutexLock lock(&map_mu);
    map = std::move(m);
    ++map_switches;
    return absl::OkStatus();
  }
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const proto::ClusterConfig& config,
                                                        const ClientOptions& options) {
  absl::Status valid = cluster::ValidateClusterConfig(config);
  if (!valid.ok()) return valid;
  if (options.worker >= config.workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", options.worker,
                                                   " out of range: the job has ",
                                                   config.workers(), " workers"));
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (impl->config.max_message_bytes() == 0) {
    impl->config.set_max_message_bytes(2 * config.chunk_bytes() + (1 << 20));
  }
  impl->options = options;
  if (impl->options.name.empty()) impl->options.name = absl::StrCat("worker-", options.worker);
  impl->uplink = cluster::UplinkCodec(config);
  // TLS or plaintext and the job token, as the config's `security` says.
  absl::StatusOr<cluster::ClientSecurity> security = cluster::MakeClientSecurity(config);
  if (!security.ok()) return security.status();
  impl->security = std::make_unique<cluster::ClientSecurity>(*std::move(security));
  if (!options.metrics_address.empty()) {
    Impl* raw = impl.get();
    impl->metrics = std::make_shared<ClientMetrics>(config.job(), options.worker,
                                                    [raw] { return raw->Stats(); });
    absl::StatusOr<std::unique_ptr<MetricsExposer>> exposer =
        MetricsExposer::Start(options.metrics_address, impl->metrics);
    if (!exposer.ok()) return exposer.status();
    impl->metrics_exposer = *std::move(exposer);
  }
  std::shared_ptr<MapState> m = impl->BuildMap(impl->config);
  {
    absl::MutexLock lock(&impl->map_mu);
    impl->map = m;
  }
  if (absl::Status s = impl->RegisterAll(*m, /*wait_for_ready=*/true); !s.ok()) return s;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::Status Client::Declare(const std::string& key, codec::DType dtype, size_t elements,
                             const void* initial) {
  Impl& m = *impl_;
  TensorInfo t;
  t.dtype = dtype;
  t.layout = cluster::ChunkLayout(elements, codec::DTypeBytes(dtype), m.config.chunk_bytes());
  if (absl::Status s = m.DeclareOn(*m.Map(), key, t, elements, initial); !s.ok()) return s;
  absl::MutexLock lock(&m.mu);
  m.tensors[key] = std::move(t);
  return absl::OkStatus();
}

absl::Status Client::Impl::DeclareOn(const MapState& seen, const std::string& key,
                                     const TensorInfo& t, size_t elements, const void* initial,
                                     bool may_switch) {
  const MapState* m = &seen;
  std::shared_ptr<const MapState> newer;
  for (int switches = 0;; ++switches) {
    // Initial values go to each chunk's owner and backups.
    const std::vector<uint32_t> holders = m->Holders(key, t);
    const size_t esize = codec::DTypeBytes(t.dtype);
    const uint64_t batch_bytes = config.max_message_bytes() / 2;
    bool aborted = false;
    for (int s = 0; s < m->config.shards_size() && !aborted; ++s) {
      if (m->down[s]) continue;
      // One request without values, then the held chunks' initial values in batches.
      std::vector<proto::DeclareTensorRequest> requests(1);
      uint64_t bytes = 0;
      if (initial != nullptr) {
        for (uint32_t c = 0; c < t.layout.num_chunks; ++c) {
          const uint32_t* set = &holders[c * m->replicas];
          if (std::find(set, set + m->replicas, static_cast<uint32_t>(s)) == set + m->replicas) {
            continue;
          }
          const size_t n = t.layout.size(c);
          if (bytes + n * esize > batch_bytes && requests.back().initial_size() > 0) {
            requests.emplace_back();
            bytes = 0;
          }
          proto::ChunkValue* v = requests.back().add_initial();
          v->set_chunk(c);
          v->set_data(static_cast<const char*>(initial) + t.layout.begin(c) * esize, n * esize);
          bytes += n * esize;
        }
      }
      for (proto::DeclareTensorRequest& req : requests) {
        req.set_job(config.job());
        req.set_key(key);
        req.set_dtype(cluster::ToProto(t.dtype));
        req.set_elements(elements);
        req.set_shard_map_epoch(m->epoch());
        proto::DeclareTensorResponse resp;
        grpc::Status st = WithRetries([&] {
          grpc::ClientContext ctx;
          ctx.set_deadline(DeadlineIn(config.rpc_timeout_ms()));
          return Stub(*m, s)->DeclareTensor(&ctx, req, &resp);
        }, m);
        absl::Status error;
        if (!st.ok() && may_switch && switches < kMaxMapSwitches &&
            ResendAfterSwitch(st, *m, s, &error)) {
          aborted = true;
          break;
        }
        if (!error.ok()) return error;
        if (!st.ok()) {
          return FromGrpc(st, absl::StrCat("declaring '", key, "' on shard ", s));
        }
      }
    }
    if (!aborted) return absl::OkStatus();
    newer = Map();  // declare again, all of it, under the new map
    m = newer.get();
  }
}

absl::Status Client::Impl::RunPushPull(const std::string& key, int64_t step, const void* input,
                                       void* output) {
  absl::StatusOr<TensorInfo> found = Find(key);
  if (!found.ok()) return found.status();
  const TensorInfo& t = *found;
  const size_t esize = codec::DTypeBytes(t.dtype);
  const size_t num_chunks = t.layout.num_chunks;
  // The map and owners the chunks go to; replaced (under map_mu) if a re-shard moves the
  // job while this call runs.
  absl::Mutex owners_mu;
  std::shared_ptr<const MapState> map_now = Map();
  std::vector<uint32_t> owners = map_now->Owners(key, t);
  auto current = [&](uint32_t chunk) {
    absl::MutexLock lock(&owners_mu);
    std::shared_ptr<const MapState> latest = Map();
    if (latest != map_now) {
      map_now = latest;
      owners = latest->Owners(key, t);
    }
    return std::make_pair(map_now, owners[chunk]);
  };
  const size_t senders = std::min<size_t>(config.max_inflight_chunks(), num_chunks);

  // Device tensors: every chunk is encoded up front in one GPU batch, and the replies are
  // kept (checked) to be decoded in one GPU batch at the end.
  const bool on_device = gpu::IsDevicePointer(input);
  if (on_device != gpu::IsDevicePointer(output)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push-pull of '", key, "': input and output must both be host or both be CUDA memory"));
  }
  std::vector<std::string> device_encoded;
  std::vector<proto::CompressedBlock> device_replies;
  if (on_device) {
    absl::StatusOr<std::vector<std::string>> enc =
        EncodeDeviceChunks(uplink, t.dtype, input, t.layout);
    if (!enc.ok()) return enc.status();
    device_encoded = *std::move(enc);
    device_replies.resize(num_chunks);
  }

  // Encoded chunks wait here for a sender; bounded so encoding runs at most `senders`
  // chunks ahead of the network.
  std::mutex qmu;
  std::condition_variable qcv;
  std::deque<std::unique_ptr<proto::CompressedBlock>> queue;
  bool closed = false;
  absl::Status first_error;
  std::atomic<bool> failed{false};

  auto fail = [&](absl::Status s) {
    std::lock_guard<std::mutex> lock(qmu);
    if (first_error.ok()) first_error = std::move(s);
    failed = true;
    qcv.notify_all();
  };

  auto send = [&] {
    while (true) {
      std::unique_ptr<proto::CompressedBlock> req;
      {
        std::unique_lock<std::mutex> lock(qmu);
        qcv.wait(lock, [&] { return !queue.empty() || closed || failed; });
        if (failed || queue.empty()) return;
        req = std::move(queue.front());
        queue.pop_front();
        qcv.notify_all();
      }
      const uint32_t chunk = req->address().chunk();
      proto::CompressedBlock resp;
      grpc::Status st;
      std::shared_ptr<const MapState> m;
      uint32_t shard = 0;
      for (int switches = 0;; ++switches) {
        std::tie(m, shard) = current(chunk);
        if (shard == cluster::ShardMap::kNone) {
          fail(m->NoOwner(key, t, chunk));
          return;
        }
        req->mutable_address()->set_shard_map_epoch(m->epoch());
        st = WithRetries([&] {
          grpc::ClientContext ctx;
          ctx.set_deadline(DeadlineIn(config.rpc_timeout_ms()));
          return Stub(*m, shard)->PushPull(&ctx, *req, &resp);
        }, m.get());
        // A re-shard replaced the map: move to the new one and resend (pushes are
        // idempotent, and the chunk's state, cached result included, moved with it).
        absl::Status error;
        if (st.ok() || switches >= kMaxMapSwitches) break;
        if (ResendAfterSwitch(st, *m, shard, &error)) continue;
        if (!error.ok()) {
          fail(error);
          return;
        }
        break;
      }
      const std::string where = absl::StrCat("push-pull of '", key, "' chunk ", chunk, " step ",
                                             step, " on shard ", shard, " (",
                                             m->config.shards(shard), ")");
      if (!st.ok()) {
        fail(FromGrpc(st, where));
        return;
      }
      if (resp.address().key() != key || resp.address().chunk() != chunk ||
          resp.address().step() != step) {
        fail(absl::InternalError(absl::StrCat(where, ": reply addressed to '",
                                              resp.address().key(), "' chunk ",
                                              resp.address().chunk(), " step ",
                                              resp.address().step())));
        return;
      }
      const size_t n = t.layout.size(chunk);
      absl::Status d =
          on_device ? cluster::CheckWireBlock(resp, t.dtype, n)
                    : cluster::DecodeWireBlock(
                          resp, t.dtype, n,
                          static_cast<char*>(output) + t.layout.begin(chunk) * esize);
      if (!d.ok()) {
        fail(absl::Status(d.code(), absl::StrCat(where, ": reply: ", d.message())));
        return;
      }
      raw_received += n * esize;
      wire_received += resp.data().size();
      ++chunks;
      if (on_device) device_replies[chunk] = std::move(resp);  // each chunk has one sender
    }
  };

  std::vector<std::thread> threads;
  threads.reserve(senders);
  for (size_t i = 0; i < senders; ++i) threads.emplace_back(send);
  for (uint32_t c = 0; c < num_chunks && !failed; ++c) {
    auto req = std::make_unique<proto::CompressedBlock>();
    const size_t n = t.layout.size(c);
    absl::Status s =
        on_device
            ? cluster::FillWireBlock(uplink, t.dtype, n, std::move(device_encoded[c]), req.get())
            : cluster::EncodeWireBlock(uplink, t.dtype,
                                       static_cast<const char*>(input) + t.layout.begin(c) * esize,
                                       n, req.get());
    if (!s.ok()) {
      fail(s);
      break;
    }
    proto::BlockAddress* a = req->mutable_address();
    a->set_job(config.job());
    a->set_key(key);
    a->set_chunk(c);
    a->set_step(step);
    a->set_worker(options.worker);
    raw_sent += n * esize;
    wire_sent += req->data().size();
    std::unique_lock<std::mutex> lock(qmu);
    qcv.wait(lock, [&] { return queue.size() < senders || failed; });
    queue.push_back(std::move(req));
    qcv.notify_all();
  }
  {
    std::lock_guard<std::mutex> lock(qmu);
    closed = true;
    qcv.notify_all();
  }
  for (std::thread& th : threads) th.join();
  if (first_error.ok() && on_device) {
    return DecodeDeviceChunks(t.dtype, device_replies, t.layout, output);
  }
  return first_error;
}

std::future<absl::Status> Client::PushPullAsync(const std::string& key, int64_t step,
                                                const void* input, void* output) {
  return std::async(std::launch::async, [this, key, step, input, output] {
    return PushPull(key, step, input, output);
  });
}

absl::Status Client::PushPull(const std::string& key, int64_t step, const void* input,
                              void* output) {
  const absl::Time start = absl::Now();
  absl::Status s = impl_->RunPushPull(key, step, input, output);
  if (impl_->metrics != nullptr) impl_->metrics->ObservePushPull(absl::ToDoubleSeconds(absl::Now() - start));
  return s;
}

int Client::metrics_port() const {
  return impl_->metrics_exposer == nullptr ? 0 : impl_->metrics_exposer->port();
}

absl::Status Client::Pull(const std::string& key, void* output) {
  Impl& m = *impl_;
  absl::StatusOr<TensorInfo> found = m.Find(key);
  if (!found.ok()) return found.status();
  const TensorInfo& t = *found;
  const size_t esize = codec::DTypeBytes(t.dtype);
  const bool on_device = gpu::IsDevicePointer(output);
  std::vector<proto::CompressedBlock> device_replies(on_device ? t.layout.num_chunks : 0);
  for (uint32_t c = 0; c < t.layout.num_chunks; ++c) {
    absl::StatusOr<proto::CompressedBlock> pulled = m.PullChunk(key, t, c);
    if (!pulled.ok()) return pulled.status();
    proto::CompressedBlock& resp = *pulled;
    if (on_device) {
      if (absl::Status d = cluster::CheckWireBlock(resp, t.dtype, t.layout.size(c)); !d.ok()) {
        return d;
      }
      device_replies[c] = std::move(resp);
      continue;
    }
    absl::Status d = cluster::DecodeWireBlock(
        resp, t.dtype, t.layout.size(c), static_cast<char*>(output) + t.layout.begin(c) * esize);
    if (!d.ok()) return d;
  }
  if (on_device) return DecodeDeviceChunks(t.dtype, device_replies, t.layout, output);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Client::ResumeStep(const std::string& key) {
  Impl& m = *impl_;
  absl::StatusOr<TensorInfo> found = m.Find(key);
  if (!found.ok()) return found.status();
  const TensorInfo& t = *found;
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (uint32_t c = 0; c < t.layout.num_chunks; ++c) {
    absl::StatusOr<proto::CompressedBlock> pulled = m.PullChunk(key, t, c);
    if (!pulled.ok()) return pulled.status();
    proto::CompressedBlock& resp = *pulled;
    // A chunk's value carries its last completed step (-1: none yet).
    oldest = std::min(oldest, resp.address().step());
  }
  return oldest + 1;
}

ClientStats Client::stats() const { return impl_->Stats(); }

const proto::ClusterConfig& Client::config() const { return impl_->config; }
uint32_t Client::worker() const { return impl_->options.worker; }

}  // namespace gcomp::worker
