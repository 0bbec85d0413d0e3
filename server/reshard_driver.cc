#include "server/reshard_driver.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/logging.h"
#include "cluster/reshard_coordinator.h"
#include "coord/reshard_record.h"

namespace gcomp::server {

struct ReshardDriver::Shared {
  Shared(ClusterState* s, proto::ClusterConfig c, ReshardDriverOptions o)
      : state(s), config(std::move(c)), options(o) {}

  // Every use of `state` holds mu with `stopped` false: the destructor sets it, under mu,
  // before the state goes away.
  absl::Mutex mu;
  bool stopped ABSL_GUARDED_BY(mu) = false;
  ClusterState* const state;
  const proto::ClusterConfig config;
  const ReshardDriverOptions options;

  void Loop();
  // One look at the record; acts on it if this shard leads. False once stopped.
  bool Step();
  // The config `record_config` names, with this shard's own security settings (paths and
  // files are each process's own).
  proto::ClusterConfig WithOwnSecurity(proto::ClusterConfig record_config) const {
    *record_config.mutable_security() = config.security();
    return record_config;
  }
  // Writes how the re-shard ended; the map record moves to `next` when it is done.
  void Record(coord::VersionedReshard base, const proto::ClusterConfig& from,
              const proto::ClusterConfig& next, const absl::StatusOr<cluster::ReshardResult>& result);
};

ReshardDriver::ReshardDriver(ClusterState* state, proto::ClusterConfig config,
                             ReshardDriverOptions options)
    : shared_(std::make_shared<Shared>(state, std::move(config), options)) {
  thread_ = std::thread([shared = shared_] { shared->Loop(); });
}

ReshardDriver::~ReshardDriver() {
  {
    absl::MutexLock lock(&shared_->mu);
    shared_->stopped = true;
  }
  // A thread between two looks ends within a poll; one inside a re-shard may take minutes
  // and is left to end by itself (it holds `shared_`, and checks `stopped` before any use
  // of the state).
  thread_.detach();
}

void ReshardDriver::Shared::Loop() {
  while (Step()) {
    absl::MutexLock lock(&mu);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stopped; };
    if (mu.AwaitWithTimeout(absl::Condition(&stop), options.poll)) return;
  }
}

bool ReshardDriver::Shared::Step() {
  std::optional<coord::VersionedReshard> base;
  {
    absl::MutexLock lock(&mu);
    if (stopped) return false;
    const auto pending = [this](bool p) {
      if (options.on_pending) options.on_pending(p);
    };
    if (!state->Leading()) {
      pending(false);
      return true;
    }
    absl::StatusOr<std::optional<coord::VersionedReshard>> read = state->ReadReshard();
    if (!read.ok()) {
      log::Warn("re-shard record: {}", read.status().ToString());
      return true;
    }
    const bool unfinished = read->has_value() && !coord::Finished((*read)->record);
    pending(unfinished);
    if (!unfinished) return true;
    base = **read;
  }
  const proto::ReshardRecord& asked = base->record;
  const proto::ClusterConfig next = WithOwnSecurity(asked.next());
  cluster::ReshardOptions o;
  o.at_step = asked.at_step();
  if (asked.deadline_ms() != 0) o.deadline = absl::Milliseconds(asked.deadline_ms());
  o.finish_timeout = options.finish_timeout;

  if (asked.phase() == proto::ReshardRecord::COMMITTED) {
    const proto::ClusterConfig from = WithOwnSecurity(asked.from());
    log::Info("re-shard to epoch {}: committed at step {} by {}; finishing it",
              asked.next().shard_map_epoch(), asked.switch_step(), asked.decided_by());
    Record(*base, from, next, cluster::FinishReshard(from, next, asked.switch_step(), o));
    return true;
  }
  log::Info("re-shard to epoch {} ({} shards) asked for by {}: coordinating it",
            asked.next().shard_map_epoch(), asked.next().shards_size(), asked.requested_by());
  proto::ClusterConfig from;
  o.before_commit = [&](const proto::ClusterConfig& running, int64_t switch_step) -> absl::Status {
    absl::MutexLock lock(&mu);
    if (stopped) return absl::CancelledError("the coordinator is shutting down");
    proto::ReshardRecord committed = base->record;
    committed.set_phase(proto::ReshardRecord::COMMITTED);
    *committed.mutable_from() = running;
    committed.mutable_from()->clear_security();
    committed.set_switch_step(switch_step);
    absl::StatusOr<coord::VersionedReshard> written = state->UpdateReshard(*base, committed);
    if (!written.ok()) return written.status();
    base = *std::move(written);
    from = running;
    return absl::OkStatus();
  };
  absl::StatusOr<cluster::ReshardResult> result = cluster::RunReshard(next, o);
  Record(*base, from, next, result);
  return true;
}

void ReshardDriver::Shared::Record(coord::VersionedReshard base, const proto::ClusterConfig& from,
                                   const proto::ClusterConfig& next,
                                   const absl::StatusOr<cluster::ReshardResult>& result) {
  absl::MutexLock lock(&mu);
  if (stopped) return;
  proto::ReshardRecord end = base.record;
  if (result.ok()) {
    // The committed map follows, so that failover and restarts work from the new one.
    if (absl::Status s = state->CommitMap(from, next); !s.ok()) {
      log::Warn("re-shard to epoch {} done, but the map record was not moved: {}",
                next.shard_map_epoch(), s.ToString());
    }
    end.set_phase(proto::ReshardRecord::DONE);
    end.set_result_json(result->ToJson());
    log::Info("re-shard done: {}", end.result_json());
  } else {
    end.set_phase(proto::ReshardRecord::FAILED);
    end.set_error(std::string(result.status().message()));
    log::Error("re-shard to epoch {} failed: {}", next.shard_map_epoch(), result.status().ToString());
  }
  absl::Status s = state->UpdateReshard(base, end).status();
  if (!s.ok()) log::Warn("re-shard record not updated: {}", s.ToString());
  if (s.ok() && options.on_pending) options.on_pending(false);
}

}  // namespace gcomp::server
