#include "coord/reshard_record.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "coord/map_record.h"

namespace gcomp::coord {

bool Finished(const proto::ReshardRecord& r) {
  return r.phase() == proto::ReshardRecord::DONE || r.phase() == proto::ReshardRecord::FAILED;
}

const std::string& PhaseName(proto::ReshardRecord::Phase phase) {
  return proto::ReshardRecord::Phase_Name(phase);
}

absl::StatusOr<std::optional<VersionedReshard>> ReadReshard(Store* store, const std::string& job) {
  const std::string key = JobKeys(job).reshard;
  absl::StatusOr<std::optional<KeyValue>> kv = store->Get(key);
  if (!kv.ok()) return kv.status();
  if (!kv->has_value()) return std::optional<VersionedReshard>();
  VersionedReshard out;
  if (!out.record.ParseFromString((*kv)->value) ||
      out.record.phase() == proto::ReshardRecord::PHASE_UNSPECIFIED) {
    return absl::DataLossError(absl::StrCat("the re-shard record at ", key,
                                            " does not parse as a ReshardRecord"));
  }
  out.revision = (*kv)->mod_revision;
  return std::optional<VersionedReshard>(std::move(out));
}

absl::StatusOr<VersionedReshard> RequestReshard(Store* store, const std::string& job,
                                                proto::ReshardRecord request) {
  if (request.phase() != proto::ReshardRecord::REQUESTED || request.next().shards().empty()) {
    return absl::InvalidArgumentError("a re-shard request needs phase REQUESTED and a next map");
  }
  const std::string key = JobKeys(job).reshard;
  // A race with another requester or the coordinator is read again; a few rounds settle it.
  for (int attempt = 0; attempt < 5; ++attempt) {
    absl::StatusOr<std::optional<VersionedReshard>> now = ReadReshard(store, job);
    if (!now.ok()) return now.status();
    Txn txn;
    if (now->has_value()) {
      const proto::ReshardRecord& held = (*now)->record;
      const bool same = held.next().shard_map_epoch() == request.next().shard_map_epoch();
      if (same && held.phase() != proto::ReshardRecord::FAILED) return **now;
      if (!same && !Finished(held)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a re-shard to epoch ", held.next().shard_map_epoch(), " is ", PhaseName(held.phase()),
            " (", key, "); ask again when it is done"));
      }
      txn.conditions.push_back({key, Condition::Field::kModRevision, (*now)->revision});
    } else {
      txn.conditions.push_back({key, Condition::Field::kCreateRevision, 0});
    }
    txn.puts.push_back({key, request.SerializeAsString(), kNoLease});
    absl::StatusOr<TxnResult> r = store->Commit(txn);
    if (!r.ok()) return r.status();
    if (r->committed) return VersionedReshard{std::move(request), r->revision};
  }
  return absl::AbortedError(absl::StrCat("the re-shard record at ", key,
                                         " kept changing while a request was written"));
}

absl::StatusOr<VersionedReshard> UpdateReshard(Store* store, const std::string& job,
                                               const VersionedReshard& base,
                                               proto::ReshardRecord next, const Leadership& leader) {
  const std::string key = JobKeys(job).reshard;
  Txn txn;
  txn.conditions.push_back({key, Condition::Field::kModRevision, base.revision});
  txn.conditions.push_back(leader.StillLeader());
  txn.puts.push_back({key, next.SerializeAsString(), kNoLease});
  absl::StatusOr<TxnResult> r = store->Commit(txn);
  if (!r.ok()) return r.status();
  if (!r->committed) {
    return absl::AbortedError(absl::StrCat("the re-shard record changed since revision ",
                                           base.revision,
                                           " or this coordinator's leadership ended; nothing was "
                                           "written"));
  }
  return VersionedReshard{std::move(next), r->revision};
}

}  // namespace gcomp::coord
