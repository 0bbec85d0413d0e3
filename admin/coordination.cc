#include "admin/coordination.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/json.h"
#include "coord/etcd_store.h"
#include "coord/job_run.h"
#include "coord/map_record.h"
#include "coord/reshard_record.h"

namespace gcomp::admin {

bool CoordinationStatus::healthy() const {
  if (!map) return false;
  for (uint32_t k = 0; k < static_cast<uint32_t>(map->shards_size()); ++k) {
    const bool down = std::find(map->down_shards().begin(), map->down_shards().end(), k) !=
                      map->down_shards().end();
    if (!down && !members.count(k)) return false;
  }
  return true;
}

absl::StatusOr<CoordinationStatus> CollectCoordination(coord::Store* store, const std::string& job) {
  CoordinationStatus out;
  absl::StatusOr<std::optional<coord::VersionedMap>> map = coord::ReadMap(store, job);
  if (!map.ok()) return map.status();
  if (map->has_value()) {
    out.map = (*map)->record;
    out.map_revision = (*map)->revision;
  }
  const coord::JobKeys keys(job);
  absl::StatusOr<std::vector<coord::KeyValue>> kvs = store->GetPrefix(keys.members);
  if (!kvs.ok()) return kvs.status();
  for (const coord::KeyValue& kv : *kvs) {
    uint32_t k = 0;
    CoordinationStatus::Member m;
    if (!absl::SimpleAtoi(kv.key.substr(keys.members.size()), &k) ||
        !m.record.ParseFromString(kv.value)) {
      return absl::DataLossError(absl::StrCat("member record ", kv.key, " does not parse"));
    }
    m.lease = kv.lease;
    out.members[k] = std::move(m);
  }
  absl::StatusOr<std::optional<coord::KeyValue>> leader = store->Get(keys.coordinator);
  if (!leader.ok()) return leader.status();
  if (leader->has_value()) out.coordinator = (*leader)->value;
  absl::StatusOr<proto::RunRecord> run = coord::ReadRun(store, job);
  if (!run.ok()) return run.status();
  out.run = *std::move(run);
  absl::StatusOr<std::optional<coord::VersionedReshard>> reshard = coord::ReadReshard(store, job);
  if (!reshard.ok()) return reshard.status();
  if (reshard->has_value()) out.reshard = (*reshard)->record;
  return out;
}

absl::StatusOr<coord::VersionedReshard> RequestReshardTo(coord::Store* store,
                                                         const proto::ClusterConfig& next,
                                                         int64_t at_step, absl::Duration deadline) {
  proto::ReshardRecord request;
  request.set_phase(proto::ReshardRecord::REQUESTED);
  *request.mutable_next() = next;
  request.mutable_next()->clear_security();  // paths on this machine mean nothing to a shard
  request.set_at_step(at_step);
  request.set_deadline_ms(static_cast<uint32_t>(
      std::min<int64_t>(absl::ToInt64Milliseconds(deadline), std::numeric_limits<uint32_t>::max())));
  request.set_requested_by("gcomp_admin");
  request.set_requested_unix_ms(absl::ToUnixMillis(absl::Now()));
  return coord::RequestReshard(store, next.job(), request);
}

absl::StatusOr<std::string> AwaitReshard(coord::Store* store, const std::string& job,
                                         uint64_t epoch, absl::Duration wait) {
  const absl::Time end = absl::Now() + wait;
  while (true) {
    absl::StatusOr<std::optional<coord::VersionedReshard>> read = coord::ReadReshard(store, job);
    if (!read.ok()) return read.status();
    if (!read->has_value()) return absl::AbortedError("the job's re-shard record is gone from etcd");
    const proto::ReshardRecord& now = (*read)->record;
    if (now.next().shard_map_epoch() != epoch) {
      return absl::AbortedError(absl::StrCat("the job's re-shard record now asks for epoch ",
                                             now.next().shard_map_epoch(), ", not ", epoch));
    }
    if (now.phase() == proto::ReshardRecord::DONE) return now.result_json();
    if (now.phase() == proto::ReshardRecord::FAILED) {
      return absl::FailedPreconditionError(absl::StrCat("the coordinator (", now.decided_by(),
                                                        ") failed the re-shard: ", now.error()));
    }
    if (absl::Now() >= end) {
      return absl::DeadlineExceededError(absl::StrCat(
          "the re-shard to epoch ", epoch, " is still ", coord::PhaseName(now.phase()),
          now.phase() == proto::ReshardRecord::COMMITTED
              ? absl::StrCat(" (switch at step ", now.switch_step(), ")")
              : " (does a shard coordinate? gcomp_admin status shows the coordinator)",
          " after ", absl::FormatDuration(wait), "; the coordinator goes on with it"));
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

absl::StatusOr<std::string> AskForReshard(coord::Store* store, const proto::ClusterConfig& next,
                                          int64_t at_step, absl::Duration deadline,
                                          absl::Duration wait) {
  absl::StatusOr<coord::VersionedReshard> asked = RequestReshardTo(store, next, at_step, deadline);
  if (!asked.ok()) return asked.status();
  return AwaitReshard(store, next.job(), next.shard_map_epoch(), wait);
}

absl::StatusOr<CoordinationStatus> CollectCoordination(const proto::ClusterConfig& config) {
  if (config.coordination().etcd().empty()) {
    return absl::FailedPreconditionError("the config's coordination.etcd lists no etcd member");
  }
  absl::StatusOr<std::unique_ptr<coord::EtcdStore>> store =
      coord::EtcdStore::Create(coord::EtcdStoreOptionsFrom(config.coordination()));
  if (!store.ok()) return store.status();
  return CollectCoordination(store->get(), config.job());
}

std::string FormatCoordinationText(const CoordinationStatus& s) {
  std::string out;
  if (!s.map) {
    absl::StrAppend(&out, "etcd: no map record yet (the job's shards have not started)\n");
  } else {
    absl::StrAppend(&out, "etcd: map epoch ", s.map->epoch(), " (revision ", s.map_revision,
                    ", written by ", s.map->written_by(), "), down [",
                    absl::StrJoin(s.map->down_shards(), ", "), "], joining [",
                    absl::StrJoin(s.map->joining_shards(), ", "), "]\n");
  }
  absl::StrAppend(&out, "coordinator: ", s.coordinator.empty() ? "none" : s.coordinator, "\n");
  std::vector<std::string> held, none;
  for (const auto& [k, m] : s.members) {
    held.push_back(absl::StrCat(
        "shard ", k, " (", m.record.address(), ", lease ", m.lease,
        m.record.generation() != 0 ? absl::StrCat(", run ", m.record.generation())
                                   : std::string(", not serving yet"),
        ")"));
  }
  if (s.map) {
    for (uint32_t k = 0; k < static_cast<uint32_t>(s.map->shards_size()); ++k) {
      if (!s.members.count(k)) none.push_back(absl::StrCat("shard ", k));
    }
  }
  absl::StrAppend(&out, "leases: ", held.empty() ? "none" : absl::StrJoin(held, ", "));
  if (!none.empty()) absl::StrAppend(&out, "; none: ", absl::StrJoin(none, ", "));
  absl::StrAppend(&out, "\n");
  if (s.run.generation() != 0) {
    absl::StrAppend(&out, "run: ", s.run.generation(), ", started by ", s.run.started_by(),
                    ", restores ", s.run.restore_set().empty() ? "nothing" : s.run.restore_set(),
                    ", entered [", absl::StrJoin(s.run.entered(), ", "), "]\n");
  }
  if (s.reshard) {
    const proto::ReshardRecord& r = *s.reshard;
    absl::StrAppend(&out, "re-shard: to epoch ", r.next().shard_map_epoch(), " (",
                    r.next().shards_size(), " shards), ", coord::PhaseName(r.phase()));
    if (r.phase() == proto::ReshardRecord::COMMITTED || r.phase() == proto::ReshardRecord::DONE) {
      absl::StrAppend(&out, " at step ", r.switch_step());
    }
    absl::StrAppend(&out, ", asked for by ", r.requested_by());
    if (!r.decided_by().empty()) absl::StrAppend(&out, ", decided by ", r.decided_by());
    if (!r.error().empty()) absl::StrAppend(&out, ": ", r.error());
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string FormatCoordinationJson(const CoordinationStatus& s) {
  std::string map = "null";
  if (s.map) {
    map = absl::StrCat("{\"epoch\":", s.map->epoch(), ",\"shards\":[",
                       absl::StrJoin(s.map->shards(), ",",
                                     [](std::string* o, const std::string& a) {
                                       absl::StrAppend(o, JsonQuote(a));
                                     }),
                       "],\"replicas\":", s.map->replicas(), ",\"down\":[",
                       absl::StrJoin(s.map->down_shards(), ","), "],\"joining\":[",
                       absl::StrJoin(s.map->joining_shards(), ","),
                       "],\"written_by\":", JsonQuote(s.map->written_by()), "}");
  }
  std::string run = "null";
  if (s.run.generation() != 0) {
    run = absl::StrCat("{\"generation\":", s.run.generation(), ",\"started_by\":",
                       JsonQuote(s.run.started_by()), ",\"restore_set\":",
                       JsonQuote(s.run.restore_set()), ",\"entered\":[",
                       absl::StrJoin(s.run.entered(), ","), "]}");
  }
  std::string reshard = "null";
  if (s.reshard) {
    const proto::ReshardRecord& r = *s.reshard;
    reshard = absl::StrCat("{\"epoch\":", r.next().shard_map_epoch(), ",\"shards\":",
                           r.next().shards_size(), ",\"phase\":", JsonQuote(coord::PhaseName(r.phase())),
                           ",\"switch_step\":", r.switch_step(), ",\"requested_by\":",
                           JsonQuote(r.requested_by()), ",\"decided_by\":", JsonQuote(r.decided_by()),
                           ",\"error\":", JsonQuote(r.error()), "}");
  }
  std::vector<std::string> members;
  for (const auto& [k, m] : s.members) {
    members.push_back(absl::StrCat("{\"shard\":", k, ",\"address\":", JsonQuote(m.record.address()),
                                   ",\"lease\":", m.lease, ",\"incarnation\":",
                                   m.record.incarnation(), ",\"run\":", m.record.generation(),
                                   "}"));
  }
  return absl::StrCat("{\"map\":", map, ",\"revision\":", s.map_revision, ",\"coordinator\":",
                      JsonQuote(s.coordinator), ",\"members\":[", absl::StrJoin(members, ","),
                      "],\"healthy\":", s.healthy() ? "true" : "false", ",\"run\":", run,
                      ",\"reshard\":", reshard, "}");
}

}  // namespace gcomp::admin
