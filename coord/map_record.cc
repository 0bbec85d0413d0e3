#include "coord/map_record.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gcomp::coord {

JobKeys::JobKeys(const std::string& job)
    : prefix(absl::StrCat("/gcomp/", job, "/")),
      map(prefix + "map"),
      members(prefix + "members/"),
      coordinator(prefix + "coordinator"),
      run(prefix + "run"),
      reshard(prefix + "reshard") {}

std::string JobKeys::Member(uint32_t shard) const { return absl::StrCat(members, shard); }

absl::Status ValidateMap(const proto::ShardMapRecord& r) {
  auto bad = [](absl::string_view field, absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("shard map field '", field, "': ", what));
  };
  if (r.epoch() == 0) return bad("epoch", "must be at least 1");
  if (r.shards().empty()) return bad("shards", "no shard");
  std::set<std::string> seen;
  for (int i = 0; i < r.shards_size(); ++i) {
    if (r.shards(i).empty()) return bad("shards", absl::StrCat("shard ", i, " has no address"));
    if (!seen.insert(r.shards(i)).second) {
      return bad("shards", absl::StrCat("address ", r.shards(i), " is listed twice"));
    }
  }
  const uint32_t n = static_cast<uint32_t>(r.shards_size());
  if (r.replicas() > n) {
    return bad("replicas", absl::StrCat(r.replicas(), " copies need as many shards; ", n,
                                        " are listed"));
  }
  std::set<uint32_t> down;
  for (uint32_t d : r.down_shards()) {
    if (d >= n) return bad("down_shards", absl::StrCat("shard ", d, " is not in the map"));
    down.insert(d);
  }
  if (down.size() == n) return bad("down_shards", "every shard is down");
  for (uint32_t j : r.joining_shards()) {
    if (j >= n) return bad("joining_shards", absl::StrCat("shard ", j, " is not in the map"));
    if (down.count(j)) {
      return bad("joining_shards", absl::StrCat("shard ", j, " is also down"));
    }
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<VersionedMap> Parse(const KeyValue& kv) {
  VersionedMap out;
  if (!out.record.ParseFromString(kv.value)) {
    return absl::DataLossError(absl::StrCat("the shard map at ", kv.key,
                                            " does not parse as a ShardMapRecord"));
  }
  if (absl::Status s = ValidateMap(out.record); !s.ok()) {
    return absl::DataLossError(absl::StrCat("the shard map at ", kv.key, ": ", s.message()));
  }
  out.revision = kv.mod_revision;
  return out;
}

}  // namespace

absl::StatusOr<std::optional<VersionedMap>> ReadMap(Store* store, const std::string& job) {
  absl::StatusOr<std::optional<KeyValue>> kv = store->Get(JobKeys(job).map);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<VersionedMap>();
  absl::StatusOr<VersionedMap> m = Parse(**kv);
  if (!m.ok()) return m.status();
  return std::optional<VersionedMap>(*std::move(m));
}

absl::StatusOr<VersionedMap> CreateMapIfAbsent(Store* store, const std::string& job,
                                               const proto::ShardMapRecord& record) {
  if (absl::Status s = ValidateMap(record); !s.ok()) return s;
  const JobKeys keys(job);
  Txn txn;
  txn.conditions.push_back({keys.map, Condition::Field::kCreateRevision, 0});
  txn.puts.push_back({keys.map, record.SerializeAsString(), kNoLease});
  // Creating is idempotent (a map there, anyone's, is the map): a request that timed out
  // (its outcome unknown, as a loaded etcd answers late) is settled by reading, then tried
  // again, rather than failing the shard's start.
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<TxnResult> r = store->Commit(txn);
    if (r.ok() && r->committed) return VersionedMap{record, r->revision};
    const bool unknown = !r.ok() && (absl::IsUnavailable(r.status()) ||
                                     absl::IsDeadlineExceeded(r.status()));
    if (!r.ok() && (!unknown || attempt == kAttempts)) return r.status();
    // Refused (a map is there) or unknown: what is there settles it.
    absl::StatusOr<std::optional<VersionedMap>> existing = ReadMap(store, job);
    if (existing.ok() && existing->has_value()) return **existing;
    if (r.ok()) {
      if (!existing.ok()) return existing.status();
      return absl::AbortedError(absl::StrCat("the shard map at ", keys.map,
                                             " was deleted while it was being created"));
    }
    absl::SleepFor(absl::Milliseconds(100 * attempt));
  }
}

absl::StatusOr<VersionedMap> UpdateMap(Store* store, const std::string& job,
                                       const VersionedMap& base, proto::ShardMapRecord next,
                                       const Leadership* leader) {
  if (absl::Status s = ValidateMap(next); !s.ok()) return s;
  if (next.epoch() <= base.record.epoch()) {
    return absl::InvalidArgumentError(absl::StrCat("a new shard map needs an epoch above ",
                                                   base.record.epoch(), ", not ", next.epoch()));
  }
  const JobKeys keys(job);
  Txn txn;
  txn.conditions.push_back({keys.map, Condition::Field::kModRevision, base.revision});
  if (leader != nullptr) txn.conditions.push_back(leader->StillLeader());
  txn.puts.push_back({keys.map, next.SerializeAsString(), kNoLease});
  absl::StatusOr<TxnResult> r = store->Commit(txn);
  if (!r.ok()) return r.status();
  if (!r->committed) {
    return absl::AbortedError(absl::StrCat(
        "the shard map changed since revision ", base.revision,
        leader != nullptr ? " or this coordinator's leadership ended" : "",
        "; nothing was written"));
  }
  return VersionedMap{std::move(next), r->revision};
}

absl::StatusOr<std::map<uint32_t, proto::MemberRecord>> ReadMembers(Store* store,
                                                                    const std::string& job) {
  const JobKeys keys(job);
  absl::StatusOr<std::vector<KeyValue>> kvs = store->GetPrefix(keys.members);
  if (!kvs.ok()) return kvs.status();
  std::map<uint32_t, proto::MemberRecord> out;
  for (const KeyValue& kv : *kvs) {
    uint32_t shard = 0;
    proto::MemberRecord m;
    if (!absl::SimpleAtoi(absl::string_view(kv.key).substr(keys.members.size()), &shard) ||
        !m.ParseFromString(kv.value)) {
      return absl::DataLossError(absl::StrCat("member record ", kv.key, " does not parse"));
    }
    out[shard] = std::move(m);
  }
  return out;
}

absl::Status RegisterMember(Store* store, const std::string& job, uint32_t shard,
                            const proto::MemberRecord& member, LeaseId lease) {
  const std::string key = JobKeys(job).Member(shard);
  Txn txn;
  txn.conditions.push_back({key, Condition::Field::kCreateRevision, 0});
  txn.puts.push_back({key, member.SerializeAsString(), lease});
  absl::StatusOr<TxnResult> r = store->Commit(txn);
  if (!r.ok()) return r.status();
  if (r->committed) return absl::OkStatus();
  absl::StatusOr<std::optional<KeyValue>> held = store->Get(key);
  if (!held.ok()) return held.status();
  proto::MemberRecord other;
  if (held->has_value() && (*held)->lease == lease) return absl::OkStatus();  // ours already
  if (held->has_value()) other.ParseFromString((*held)->value);
  return absl::AlreadyExistsError(absl::StrCat(
      "shard ", shard, " of job ", job, " is already registered by a live process (",
      other.address(), ", incarnation ", other.incarnation(),
      "); two processes were started as the same shard"));
}

}  // namespace gcomp::coord
