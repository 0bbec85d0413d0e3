// The client's shard maps: building one (channels reused by address), registering with
// its shards, declaring tensors under it, and moving to a newer map when a re-shard or a
// failover replaced it (docs/SERVICE.md, "Re-sharding" and "Replication and failover").
#include <algorithm>
#include <iterator>
#include <string>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "worker/client_impl.h"

namespace gcomp::worker {

std::shared_ptr<MapState> Client::Impl::BuildMap(const proto::ClusterConfig& cfg) {
  auto m = std::make_shared<MapState>();
  m->config = cfg;
  m->map = cluster::ShardMap(cfg.shards_size(), cfg.shard_map_epoch());
  m->replicas = cluster::Replicas(cfg);
  m->down.assign(cfg.shards_size(), false);
  for (uint32_t k : cfg.down_shards()) m->down[k] = true;
  m->joining.assign(cfg.shards_size(), false);
  for (uint32_t k : cfg.joining_shards()) m->joining[k] = true;
  const int attempt_ms = ConnectAttemptMs(cfg.connect_timeout_ms());
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
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, attempt_ms);
      args.SetInt(GRPC_ARG_DNS_ARES_QUERY_TIMEOUT_MS, attempt_ms);
      args.SetMaxReceiveMessageSize(static_cast<int>(cfg.max_message_bytes()));
      args.SetMaxSendMessageSize(static_cast<int>(cfg.max_message_bytes()));
      chans.push_back(security->NewChannel(cfg.shards(s), args));
    }
    m->stubs.emplace_back();
    for (const auto& channel : chans) {
      m->stubs.back().push_back({proto::Aggregation::NewStub(channel),
                                 std::make_unique<cluster::PushPullStub>(channel)});
    }
    m->reshard.push_back(proto::Resharding::NewStub(chans[0]));
  }
  // Channels to addresses this map does not list are dropped from the cache: they close
  // once no map uses them, so maps that come and go (or a shard that hands out maps of
  // thousands of addresses) cannot pile up connections.
  const absl::flat_hash_set<std::string> listed(cfg.shards().begin(), cfg.shards().end());
  for (auto it = channels.begin(); it != channels.end();) {
    it = listed.contains(it->first) ? std::next(it) : channels.erase(it);
  }
  return m;
}

absl::Status Client::Impl::RegisterAll(const MapState& m, uint32_t timeout_ms, bool connecting,
                                       uint32_t* unreachable) {
  if (unreachable != nullptr) *unreachable = cluster::ShardMap::kNone;
  proto::RegisterWorkerRequest req;
  req.set_job(config.job());
  req.set_worker(options.worker);
  req.set_session(options.session);
  req.set_name(options.name);
  // What the shards check against their own config.
  *req.mutable_uplink() = config.uplink();
  req.set_chunk_bytes(config.chunk_bytes());
  req.set_workers(config.workers());
  req.set_shard_map_epoch(m.epoch());
  for (int s = 0; s < m.config.shards_size(); ++s) {
    if (m.down[s]) continue;  // failed over: its chunks are served by others
    for (const auto& stub : m.stubs[s]) {
      proto::RegisterWorkerResponse resp;
      grpc::Status st = WithRetries([&] {
        grpc::ClientContext ctx;
        ctx.set_wait_for_ready(true);
        ctx.set_deadline(DeadlineIn(timeout_ms));
        return stub.aggregation->RegisterWorker(&ctx, req, &resp);
      });
      if (unreachable != nullptr && (st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                                     st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)) {
        *unreachable = s;
      }
      if (connecting && st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
        // Waited for the channel the whole time: nothing answered at that address (not
        // running yet, another port, a firewall), which "Deadline Exceeded" alone hides.
        return absl::DeadlineExceededError(absl::StrCat(
            "registering with shard ", s, " (", m.config.shards(s), "): no answer within ",
            timeout_ms, " ms (connect_timeout_ms): check that gcomp_server runs at ",
            m.config.shards(s),
            ", that this machine reaches it and that both sides use the same "
            "TLS settings (",
            st.error_message(), ")"));
      }
      if (!st.ok()) {
        return FromGrpc(st, absl::StrCat("registering with shard ", s, " (", m.config.shards(s), ")"));
      }
      const auto& reads = resp.checksums_read();
      if (std::find(reads.begin(), reads.end(), cluster::kFastChecksum) == reads.end()) {
        push_checksum.store(proto::CHECKSUM_XXH64);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::FindNewerMap(const MapState& seen, uint32_t shard, uint64_t floor,
                                        proto::ClusterConfig* next, std::string* from) {
  std::vector<std::string> problems;
  from->clear();
  next->set_shard_map_epoch(0);
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
               got.shard_map_epoch() > next->shard_map_epoch()) {
      *next = std::move(got);
      *from = who;
    }
  }
  if (!from->empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "no shard of shard-map epoch ", seen.epoch(), " knows a map newer than epoch ", floor,
      problems.empty() ? "" : absl::StrCat(" (", absl::StrJoin(problems, "; "), ")")));
}

absl::Status Client::Impl::SwitchMap(const MapState& seen, uint32_t shard, absl::Duration wait) {
  absl::MutexLock switching(&switch_mu);
  if (Map()->epoch() > seen.epoch()) return absl::OkStatus();  // another call switched
  uint64_t floor = seen.epoch();
  // Until when a newer map is waited for (a failover commits one after a lease TTL); moved
  // on when a new map's shard does not answer.
  absl::Time wait_until = absl::Now() + wait;
  // Maps can follow each other quickly (a failover, then a rejoin): a map replaced while
  // this client registers with it is skipped for the newer one.
  for (int attempt = 0;; ++attempt) {
    proto::ClusterConfig next;
    std::string from;
    absl::Status found = FindNewerMap(seen, shard, floor, &next, &from);
    while (absl::IsNotFound(found) && absl::Now() < wait_until) {
      absl::SleepFor(absl::Milliseconds(250));
      found = FindNewerMap(seen, shard, floor, &next, &from);
    }
    if (!found.ok()) return found;
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
    // A shard of the new map answers once it has switched, which waits for the switch
    // step on every chunk it holds: up to rpc_timeout_ms when a chunk falls behind.
    uint32_t unreachable = cluster::ShardMap::kNone;
    absl::Status s = RegisterAll(*m, std::max(config.connect_timeout_ms(), config.rpc_timeout_ms()),
                                 false, &unreachable);
    absl::flat_hash_map<std::string, TensorInfo> declared;
    {
      absl::MutexLock lock(&mu);
      declared = tensors;
    }
    for (auto it = declared.begin(); s.ok() && it != declared.end(); ++it) {
      s = DeclareOn(*m, it->first, it->second, it->second.layout.elements, nullptr,
                    /*may_switch=*/false);
    }
    // A shard of the new map died after it was made (two faults one map apart): with
    // replicas, the next failover replaces this map too.
    const bool shard_gone = m->replicas > 1 && unreachable != cluster::ShardMap::kNone;
    if ((absl::IsAborted(s) || shard_gone) && attempt < kMaxMapSwitches) {
      if (shard_gone) {
        ReportDown(*m, unreachable, std::string(s.message()));
        wait_until = absl::Now() + absl::Milliseconds(config.rpc_timeout_ms());
      }
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
        grpc::Status st = CallShard(*m, s, [&](auto* stub, grpc::ClientContext* ctx) {
          return stub->aggregation->DeclareTensor(ctx, req, &resp);
        });
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

}  // namespace gcomp::worker
