#include "admin/coordination.h"

#include <algorithm>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "coord/etcd_store.h"
#include "coord/job_run.h"
#include "coord/map_record.h"

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
  return out;
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
  std::vector<std::string> members;
  for (const auto& [k, m] : s.members) {
    members.push_back(absl::StrCat("{\"shard\":", k, ",\"address\":", JsonQuote(m.record.address()),
                                   ",\"lease\":", m.lease, ",\"incarnation\":",
                                   m.record.incarnation(), ",\"run\":", m.record.generation(),
                                   "}"));
  }
  return absl::StrCat("{\"map\":", map, ",\"revision\":", s.map_revision, ",\"coordinator\":",
                      JsonQuote(s.coordinator), ",\"members\":[", absl::StrJoin(members, ","),
                      "],\"healthy\":", s.healthy() ? "true" : "false", ",\"run\":", run, "}");
}

}  // namespace gcomp::admin
