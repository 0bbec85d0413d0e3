#include "cluster/reshard_coordinator.h"

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/json.h"
#include "base/logging.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "cluster/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "proto/reshard.grpc.pb.h"

namespace gcomp::cluster {
namespace {

class Peers {
 public:
  explicit Peers(ClientSecurity security) : security_(std::move(security)) {}

  proto::Resharding::Stub* Stub(const std::string& address) {
    std::unique_ptr<proto::Resharding::Stub>& s = stubs_[address];
    if (s == nullptr) {
      // Shards that are starting (a new pod) must be found within seconds: gRPC's default
      // reconnect backoff grows to two minutes. (Not GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: it
      // is also the connect timeout, and a first connection to a new pod can take seconds.)
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
      s = proto::Resharding::NewStub(security_.NewChannel(address, args));
    }
    return s.get();
  }


  absl::StatusOr<proto::ClusterConfig> GetConfig(const std::string& address, absl::Duration timeout,
                                                 bool wait_for_ready) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    ctx.set_wait_for_ready(wait_for_ready);
    proto::ClusterConfig config;
    grpc::Status st = Stub(address)->GetConfig(&ctx, proto::GetConfigRequest(), &config);
    if (!st.ok()) return FromGrpc(st, absl::StrCat("asking ", address, " for its config"));
    return config;
  }

 private:
  const ClientSecurity security_;
  std::map<std::string, std::unique_ptr<proto::Resharding::Stub>> stubs_;
};

bool Contains(const proto::ClusterConfig& c, const std::string& address) {
  return std::find(c.shards().begin(), c.shards().end(), address) != c.shards().end();
}

std::vector<std::string> Everyone(const proto::ClusterConfig& old, const proto::ClusterConfig& next) {
  std::vector<std::string> everyone(old.shards().begin(), old.shards().end());
  for (const std::string& a : next.shards()) {
    if (!Contains(old, a)) everyone.push_back(a);
  }
  return everyone;
}

grpc::Status Prepare(Peers& peers, const std::string& address, const proto::ClusterConfig& old,
                     const proto::ClusterConfig& next, int64_t at_step, const ReshardOptions& options,
                     proto::PrepareReshardResponse* resp) {
  proto::PrepareReshardRequest prepare;
  *prepare.mutable_next() = next;
  prepare.set_at_step(at_step);
  prepare.set_prepare_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options.prepare_timeout)));
  prepare.set_old_shards(old.shards_size());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
  ctx.set_wait_for_ready(true);  // a shard (re)starting gets until the deadline
  return peers.Stub(address)->Prepare(&ctx, prepare, resp);
}

grpc::Status Commit(Peers& peers, const std::string& address, const proto::ClusterConfig& next,
                    int64_t switch_step, const ReshardOptions& options) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
  ctx.set_wait_for_ready(true);
  proto::CommitReshardRequest req;
  req.set_next_epoch(next.shard_map_epoch());
  req.set_switch_step(switch_step);
  proto::CommitReshardResponse resp;
  return peers.Stub(address)->Commit(&ctx, req, &resp);
}

absl::Status CommitAll(Peers& peers, const std::vector<std::string>& everyone,
                       const proto::ClusterConfig& next, int64_t switch_step,
                       const ReshardOptions& options) {
  for (const std::string& a : everyone) {
    grpc::Status st = Commit(peers, a, next, switch_step, options);
    if (!st.ok()) {
      // Shards already committed cannot go back; the shard that failed is named so that
      // an operator can look at it (it also drops the re-shard after its prepare timeout).
      return FromGrpc(st, absl::StrCat("committing the switch at step ", switch_step, " on ", a));
    }
  }
  return absl::OkStatus();
}

// Done when the new map's shards all serve it and the removed ones are drained.
absl::Status WaitFinished(Peers& peers, const proto::ClusterConfig& old,
                          const proto::ClusterConfig& next, const std::vector<std::string>& everyone,
                          int64_t switch_step, const ReshardOptions& options, ReshardResult* result) {
  const absl::Time finish_by = absl::Now() + options.finish_timeout;
  std::set<std::string> pending(everyone.begin(), everyone.end());
  while (!pending.empty()) {
    for (auto it = pending.begin(); it != pending.end();) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      proto::ReshardStatusResponse st;
      grpc::Status rpc = peers.Stub(*it)->ReshardStatus(&ctx, proto::ReshardStatusRequest(), &st);
      const bool in_new = Contains(next, *it);
      const bool done = rpc.ok() && st.shard_map_epoch() == next.shard_map_epoch() &&
                        st.state() == (in_new ? "serving" : "drained") &&
                        (!Contains(old, *it) || st.moves_sent());
      if (!done) {
        ++it;
        continue;
      }
      if (Contains(old, *it)) {
        result->chunks_moved += st.chunks_sent();
        result->bytes_moved += st.bytes_sent();
      }
      if (in_new) {
        result->chunks_total += st.chunks_owned();
        result->pause_ms = std::max(result->pause_ms, st.pause_ms());
      } else {
        result->removed.push_back(*it);
      }
      it = pending.erase(it);
    }
    if (pending.empty()) break;
    if (absl::Now() >= finish_by) {
      return absl::DeadlineExceededError(absl::StrCat(
          "re-shard to epoch ", next.shard_map_epoch(), " committed at step ", switch_step,
          " but not finished within ", absl::FormatDuration(options.finish_timeout),
          " on: ", absl::StrJoin(pending, ", "),
          " (are the workers running? the switch waits for step ", switch_step - 1, ")"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::sort(result->removed.begin(), result->removed.end());
  return absl::OkStatus();
}

ReshardResult ResultOf(const proto::ClusterConfig& old, const proto::ClusterConfig& next) {
  ReshardResult result;
  result.from_epoch = old.shard_map_epoch();
  result.to_epoch = next.shard_map_epoch();
  result.from_shards = old.shards_size();
  result.to_shards = next.shards_size();
  return result;
}

}  // namespace

std::string ReshardResult::ToJson() const {
  std::vector<std::string> quoted;
  for (const std::string& r : removed) quoted.push_back(JsonQuote(r));
  return absl::StrFormat(
      "{\"from_epoch\":%d,\"to_epoch\":%d,\"from_shards\":%d,\"to_shards\":%d,\"switch_step\":%d,"
      "\"chunks_moved\":%d,\"chunks_total\":%d,\"bytes_moved\":%d,\"pause_ms\":%.3f,"
      "\"removed\":[%s]}",
      from_epoch, to_epoch, from_shards, to_shards, switch_step, chunks_moved, chunks_total,
      bytes_moved, pause_ms, absl::StrJoin(quoted, ","));
}

absl::StatusOr<ReshardResult> RunReshard(const proto::ClusterConfig& next,
                                         const ReshardOptions& options) {
  if (absl::Status s = ValidateClusterConfig(next); !s.ok()) return s;
  absl::StatusOr<ClientSecurity> security = MakeClientSecurity(next);
  if (!security.ok()) return security.status();
  Peers peers(*std::move(security));

  // The running map, from the first shard of the new config that serves an older epoch.
  // Shards still starting are waited for, up to the deadline; when every address answers
  // and none is older, there is nothing to wait for.
  proto::ClusterConfig old;
  std::map<std::string, std::string> problems;  // by address, the last one
  const absl::Time discover_by = absl::Now() + options.deadline;
  while (true) {
    bool all_answered = true;
    for (const std::string& address : next.shards()) {
      const absl::Duration timeout = std::clamp(discover_by - absl::Now(), absl::Milliseconds(100),
                                                absl::Seconds(3));
      absl::StatusOr<proto::ClusterConfig> c = peers.GetConfig(address, timeout, true);
      if (!c.ok()) {
        problems[address] = std::string(c.status().message());
        all_answered = false;
        continue;
      }
      if (c->job() != next.job()) {
        return absl::InvalidArgumentError(absl::StrCat(address, " serves job '", c->job(),
                                                       "', the new config is of job '", next.job(), "'"));
      }
      if (c->shard_map_epoch() > next.shard_map_epoch()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cluster config field 'shard_map_epoch': ", address, " already serves epoch ",
            c->shard_map_epoch(), ", above the new config's ", next.shard_map_epoch()));
      }
      if (c->shard_map_epoch() < next.shard_map_epoch()) {
        old = *std::move(c);
        break;
      }
    }
    if (old.shards_size() > 0 || all_answered || absl::Now() >= discover_by) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  if (old.shards_size() == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "no shard of the new config serves an older shard-map epoch (is the epoch raised, and is "
        "at least one running shard kept?)",
        problems.empty() ? ""
                         : absl::StrCat("; ", absl::StrJoin(problems, "; ", absl::PairFormatter(": ")))));
  }
  // Security settings are each process's own (paths differ between machines).
  proto::ClusterConfig comparable = old;
  *comparable.mutable_security() = next.security();
  if (absl::Status s = ValidateReshard(comparable, next); !s.ok()) return s;

  ReshardResult result = ResultOf(old, next);
  std::vector<std::string> added, removed;
  for (const std::string& a : next.shards()) {
    if (!Contains(old, a)) added.push_back(a);
  }
  for (const std::string& a : old.shards()) {
    if (!Contains(next, a)) removed.push_back(a);
  }
  log::Info("re-shard of job '{}': epoch {} ({} shards) -> {} ({} shards); adding [{}], removing [{}]",
            next.job(), old.shard_map_epoch(), old.shards_size(), next.shard_map_epoch(),
            next.shards_size(), absl::StrJoin(added, ", "), absl::StrJoin(removed, ", "));

  // Added shards must be up, empty, and on the new config.
  const absl::Time up_by = absl::Now() + options.deadline;
  for (const std::string& a : added) {
    while (true) {
      absl::StatusOr<proto::ClusterConfig> c = peers.GetConfig(
          a, std::clamp(up_by - absl::Now(), absl::Milliseconds(100), absl::Seconds(10)), true);
      if (c.ok() && c->shard_map_epoch() == next.shard_map_epoch()) break;
      if (c.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "added shard ", a, " serves shard-map epoch ", c->shard_map_epoch(),
            "; start it with the new config (epoch ", next.shard_map_epoch(), "); nothing changed"));
      }
      if (absl::Now() >= up_by) {
        return absl::DeadlineExceededError(absl::StrCat(
            "added shard ", a, " did not come up within ", absl::FormatDuration(options.deadline),
            ": ", c.status().message(), "; nothing changed, the job runs on epoch ",
            old.shard_map_epoch()));
      }
      absl::SleepFor(absl::Milliseconds(200));
    }
  }

  const std::vector<std::string> everyone = Everyone(old, next);
  auto abort_all = [&](const std::string& reason) {
    for (const std::string& a : everyone) {
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
      proto::AbortReshardRequest req;
      req.set_next_epoch(next.shard_map_epoch());
      req.set_reason(reason);
      proto::AbortReshardResponse resp;
      grpc::Status st = peers.Stub(a)->Abort(&ctx, req, &resp);
      if (!st.ok()) log::Warn("re-shard: aborting on {}: {}", a, st.error_message());
    }
  };

  int64_t switch_step = std::max<int64_t>(options.at_step, 0);
  for (const std::string& a : everyone) {
    proto::PrepareReshardResponse resp;
    grpc::Status st = Prepare(peers, a, old, next, options.at_step, options, &resp);
    if (!st.ok()) {
      absl::Status s = FromGrpc(st, absl::StrCat("preparing ", a));
      abort_all(std::string(s.message()));
      return absl::Status(s.code(), absl::StrCat(s.message(), "; aborted, the job runs on epoch ",
                                                 old.shard_map_epoch()));
    }
    if (resp.in_old_map()) switch_step = std::max(switch_step, resp.highest_step() + 1);
  }
  if (options.before_commit) {
    if (absl::Status s = options.before_commit(old, switch_step); !s.ok()) {
      abort_all(std::string(s.message()));
      return absl::Status(s.code(), absl::StrCat("the decision to switch at step ", switch_step,
                                                 " could not be recorded: ", s.message(),
                                                 "; aborted, the job runs on epoch ",
                                                 old.shard_map_epoch()));
    }
  }
  if (absl::Status s = CommitAll(peers, everyone, next, switch_step, options); !s.ok()) return s;
  result.switch_step = switch_step;
  log::Info("re-shard to epoch {} committed at step {}", next.shard_map_epoch(), switch_step);
  if (absl::Status s = WaitFinished(peers, old, next, everyone, switch_step, options, &result);
      !s.ok()) {
    return s;
  }
  return result;
}

absl::StatusOr<ReshardResult> FinishReshard(const proto::ClusterConfig& old,
                                            const proto::ClusterConfig& next, int64_t switch_step,
                                            const ReshardOptions& options) {
  absl::StatusOr<ClientSecurity> security = MakeClientSecurity(next);
  if (!security.ok()) return security.status();
  Peers peers(*std::move(security));
  const std::vector<std::string> everyone = Everyone(old, next);
  log::Info("re-shard of job '{}' to epoch {}: finishing the switch at step {} decided before",
            next.job(), next.shard_map_epoch(), switch_step);
  for (const std::string& a : everyone) {
    grpc::Status st = Commit(peers, a, next, switch_step, options);
    if (st.ok()) continue;  // committed now, or already at this step
    // Not prepared any more: switched already, or its prepare ran out while no coordinator
    // led. The latter is prepared again for the same step (which it refuses if it has
    // started that step under the old map meanwhile) and committed.
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    proto::ReshardStatusResponse status;
    grpc::Status rpc = peers.Stub(a)->ReshardStatus(&ctx, proto::ReshardStatusRequest(), &status);
    if (!rpc.ok()) return FromGrpc(rpc, absl::StrCat("asking ", a, " how far its switch came"));
    const bool switched = status.shard_map_epoch() == next.shard_map_epoch() &&
                          (Contains(old, a) ? status.state() != "prepared"
                                            : status.state() == "filling" || status.chunks_owned() > 0);
    if (switched) continue;
    proto::PrepareReshardResponse prepared;
    st = Prepare(peers, a, old, next, switch_step, options, &prepared);
    if (st.ok()) st = Commit(peers, a, next, switch_step, options);
    if (!st.ok()) {
      return FromGrpc(st, absl::StrCat("committing the switch at step ", switch_step, " on ", a,
                                       " again"));
    }
  }
  ReshardResult result = ResultOf(old, next);
  result.switch_step = switch_step;
  if (absl::Status s = WaitFinished(peers, old, next, everyone, switch_step, options, &result);
      !s.ok()) {
    return s;
  }
  return result;
}

}  // namespace gcomp::cluster
