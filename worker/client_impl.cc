// Client::Impl's shared pieces: the retry loop every call runs in, the map-switch rule after
// a failed call, failure reports, and Pull.
#include "worker/client_impl.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

namespace gcomp::worker {

int ConnectAttemptMs(uint32_t connect_timeout_ms) {
  return static_cast<int>(std::clamp<uint32_t>(connect_timeout_ms / 2, 2000, 20000));
}

std::chrono::system_clock::time_point DeadlineIn(uint32_t ms) {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(ms);
}

std::vector<uint32_t> MapState::Holders(const std::string& key, const TensorInfo& t) const {
  return map.LiveReplicas(key, t.layout, replicas, down, joining);
}

std::vector<uint32_t> MapState::Owners(const std::string& key, const TensorInfo& t) const {
  if (replicas == 1) return map.Assign(key, t.layout);  // the common case, without ranking
  const std::vector<uint32_t> live = Holders(key, t);
  std::vector<uint32_t> owner(t.layout.num_chunks);
  for (size_t c = 0; c < owner.size(); ++c) owner[c] = live[c * replicas];
  return owner;
}

absl::Status MapState::NoOwner(const std::string& key, const TensorInfo& t, uint32_t c) const {
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

ClientStats Client::Impl::Stats() const {
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

std::shared_ptr<const MapState> Client::Impl::Map() const {
  absl::MutexLock lock(&map_mu);
  return map;
}

const MapState::Stubs* Client::Impl::Stub(const MapState& m, uint32_t shard) {
  auto& v = m.stubs[shard];
  return &v[next_channel.fetch_add(1, std::memory_order_relaxed) % v.size()];
}

bool Client::Impl::ResendAfterSwitch(const grpc::Status& st, const MapState& seen,
                                     uint32_t shard, absl::Status* error) {
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
  if (aborted && seen.replicas > 1 && absl::IsNotFound(s)) {
    // A failover's map reaches the shards one after the other: the shard that aborted the
    // call has it, the ones asked may not yet. Ask again shortly (the caller bounds the
    // rounds).
    absl::SleepFor(absl::Milliseconds(200));
    return true;
  }
  if (aborted || !absl::IsNotFound(s)) *error = s;
  return false;
}

void Client::Impl::ReportDown(const MapState& seen, uint32_t shard, const std::string& why) {
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

absl::StatusOr<TensorInfo> Client::Impl::Find(const std::string& key) const {
  absl::MutexLock lock(&mu);
  auto it = tensors.find(key);
  if (it == tensors.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", key, "' not declared on this client"));
  }
  return it->second;
}

grpc::Status Client::Impl::WithRetries(absl::FunctionRef<grpc::Status()> call,
                                       const MapState* map) {
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
    const int64_t backoff_ms = std::min<int64_t>(
        int64_t{config.retry_backoff_ms()} << std::min(attempt, 10u), kMaxBackoffMs);
    absl::SleepFor(absl::Milliseconds(backoff_ms));
  }
}

grpc::Status Client::Impl::CallShard(
    const MapState& m, uint32_t shard,
    absl::FunctionRef<grpc::Status(const MapState::Stubs*, grpc::ClientContext*)> rpc) {
  return WithRetries(
      [&] {
        grpc::ClientContext ctx;
        ctx.set_deadline(DeadlineIn(config.rpc_timeout_ms()));
        return rpc(Stub(m, shard), &ctx);
      },
      &m);
}

absl::StatusOr<proto::CompressedBlock> Client::Impl::PullChunk(const std::string& key,
                                                               const TensorInfo& t, uint32_t c) {
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
    if (!st.ok() && switches < kMaxMapSwitches && ResendAfterSwitch(st, *m, shard, &error)) {
      continue;
    }
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

}  // namespace gcomp::worker
