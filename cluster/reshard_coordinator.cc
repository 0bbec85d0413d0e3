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

  ReshardResult result;
  result.from_epoch = old.shard_map_epoch();
  result.to_epoch = next.shard_map_epoch();
  result.from_shards = old.shards_size();
  result.to_shards = next.shards_size();
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

  std::vector<std::string> everyone(old.shards().begin(), old.shards().end());
  everyone.insert(everyone.end(), added.begin(), added.end());
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

  proto::PrepareReshardRequest prepare;
  *prepare.mutable_next() = next;
  prepare.set_at_step(options.at_step);
  prepare.set_prepare_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options.prepare_timeout)));
  prepare.set_old_shards(old.shards_size());
  int64_t switch_step = std::max<int64_t>(options.at_step, 0);
  for (const std::string& a : everyone) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
    ctx.set_wait_for_ready(true);  // a shard (re)starting gets until the deadline
    proto::PrepareReshardResponse resp;
    grpc::Status st = peers.Stub(a)->Prepare(&ctx, prepare, &resp);
    if (!st.ok()) {
      absl::Status s = FromGrpc(st, absl::StrCat("preparing ", a));
      abort_all(std::string(s.message()));
      return absl::Status(s.code(), absl::StrCat(s.message(), "; aborted, the job runs on epoch ",
                                                 old.shard_map_epoch()));
    }
    if (resp.in_old_map()) switch_step = std::max(switch_step, resp.highest_step() + 1);
  }
  for (const std::string& a : everyone) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + options.deadline));
    ctx.set_wait_for_ready(true);
    proto::CommitReshardRequest req;
    req.set_next_epoch(next.shard_map_epoch());
    req.set_switch_step(switch_step);
    proto::CommitReshardResponse resp;
    grpc::Status st = peers.Stub(a)->Commit(&ctx, req, &resp);
    if (!st.ok()) {
      // Shards already committed cannot go back; the shard that failed is named so that
      // an operator can look at it (it also drops the re-shard after its prepare timeout).
      return FromGrpc(st, absl::StrCat("committing the switch at step ", switch_step, " on ", a));
    }
  }
  result.switch_step = switch_step;
  log::Info("re-shard to epoch {} committed at step {}", next.shard_map_epoch(), switch_step);

  // Done when the new map's shards all serve it and the removed ones are drained.
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
        result.chunks_moved += st.chunks_sent();
        result.bytes_moved += st.bytes_sent();
      }
      if (in_new) {
        result.chunks_total += st.chunks_owned();
        result.pause_ms = std::max(result.pause_ms, st.pause_ms());
      } else {
        result.removed.push_back(*it);
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
  std::sort(result.removed.begin(), result.removed.end());
  return result;
}

}  // namespace gcomp::cluster
