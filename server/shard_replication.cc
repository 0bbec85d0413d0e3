// ShardService's replication and failover (docs/SERVICE.md, "Replication and failover"):
// owners send each completed step's chunk state to the chunk's backups before answering,
// a coordinator takes unreachable shards out of the map, and backups take their chunks
// over. The rest of the class is in shard_service.cc and the files it names.
#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "cluster/cluster_config.h"
#include "cluster/wire_block.h"
#include "server/chunk_state.h"
#include "server/shard_service.h"
#include "server/shard_tensor.h"

namespace gcomp::server {
namespace {

// How long a peer has to answer a probe (connection included) before the coordinator
// counts it down: long against a GetConfig on a loaded shard, short against the pause.
constexpr absl::Duration kProbeTimeout = absl::Seconds(1);
// Rounds of installing a map: a shard that fails to take it is down too.
constexpr int kMaxInstallRounds = 4;
// Lost chunks logged one by one; the install's summary line counts them all.
constexpr uint64_t kLostChunksLogged = 5;

bool IsPeerGone(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

// `list` := the indexes set in `flags`, ascending.
void SetShardList(const std::vector<bool>& flags,
                  google::protobuf::RepeatedField<uint32_t>* list) {
  list->Clear();
  for (uint32_t k = 0; k < flags.size(); ++k) {
    if (flags[k]) list->Add(k);
  }
}

}  // namespace

std::string ShardService::ShardName(uint32_t index) const {
  return absl::StrCat("shard ", index, " (", map_config_.shards(index), ")");
}

absl::flat_hash_map<uint32_t, ShardService::TensorBackup> ShardService::AssignRolesLocked(
    Tensor* t) {
  const uint32_t self = shard_index_.load();
  const std::vector<uint32_t> old_live = std::move(t->live);
  t->live = shard_map_.LiveReplicas(t->key, t->layout, replicas_, down_, joining_shards_);
  absl::flat_hash_map<uint32_t, TensorBackup> backups;
  t->owner.resize(t->layout.num_chunks);
  for (uint32_t c = 0; c < t->layout.num_chunks; ++c) {
    t->owner[c] = t->live[c * replicas_];
    for (uint32_t j = 1; j < replicas_; ++j) {
      if (t->live[c * replicas_ + j] != self) continue;
      auto it = t->backups.find(c);
      if (it != t->backups.end()) {
        backups[c] = std::move(it->second);
        t->backups.erase(it);
      } else {
        TensorBackup fresh;  // a new backup: synced by the owner's next state
        for (uint32_t i = 0; old_live.size() == t->live.size() && i < replicas_; ++i) {
          const uint32_t k = old_live[c * replicas_ + i];
          if (k != cluster::ShardMap::kNone && k < down_.size() && down_[k]) {
            fresh.replaced.push_back(k);
          }
        }
        backups[c] = std::move(fresh);
      }
    }
  }
  std::swap(t->backups, backups);
  return backups;  // the ones no longer backed up here
}

absl::Status ShardService::ReplicateChunk(const std::string& key, uint32_t chunk,
                                          const ChunkSnapshot& snap) {
  std::vector<std::pair<uint32_t, std::string>> targets;
  uint64_t epoch = 0;
  uint32_t self = 0;
  size_t elements = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
    auto it = tensors_.find(key);
    if (it == tensors_.end()) return absl::InternalError("replicating an undeclared tensor");
    const Tensor& t = *it->second;
    self = shard_index_.load();
    epoch = epoch_.load();
    if (t.owner[chunk] != self) return absl::AbortedError(SupersededMessage(epoch));
    for (uint32_t j = 1; j < replicas_; ++j) {
      const uint32_t b = t.live[chunk * replicas_ + j];
      if (b != cluster::ShardMap::kNone) targets.emplace_back(b, map_config_.shards(b));
    }
    elements = t.layout.size(chunk);
  }
  if (targets.empty()) return absl::OkStatus();  // every other copy is down: degraded
  if (!options_.peers.send_replica) {
    return absl::FailedPreconditionError("no transport to send chunk state to backups");
  }
  proto::ChunkState state;
  if (absl::Status s = ChunkStateToProto(config_.job(), key, chunk, elements, snap, &state);
      !s.ok()) {
    return s;
  }
  const std::vector<proto::ChunkState> parts = SplitChunkState(std::move(state));
  for (const auto& [b, address] : targets) {
    absl::Status sent;
    for (size_t i = 0; i < parts.size() && sent.ok(); ++i) {
      proto::ReplicateRequest req;
      req.set_job(config_.job());
      req.set_shard_map_epoch(epoch);
      req.set_from_shard(self);
      *req.mutable_part() = parts[i];
      req.set_completes_chunk(i + 1 == parts.size());
      sent = options_.peers.send_replica(address, req);
    }
    if (sent.ok()) continue;
    if (absl::IsAborted(sent)) {
      // The backup has switched to a re-shard's map already while this shard finishes the
      // old map's last steps: the chunk's state moves with the re-shard, and its new
      // owner replicates it under the new map (no failover runs during a re-shard).
      absl::MutexLock lock(&mu_);
      if (phase_ == Phase::kCommitted && epoch_.load() == epoch) continue;
    }
    const std::string what = absl::StrCat("replicating step ", snap.completed_step, " of '", key,
                                          "' chunk ", chunk, " to backup shard ", b, " (",
                                          address, "): ", sent.message());
    if (IsPeerGone(sent)) {
      // The backup is gone: take it out of the map, then the workers resend under the
      // new one and this shard replicates to the chunk's next backup.
      proto::ReportDownRequest report;
      report.set_job(config_.job());
      report.set_shard_map_epoch(epoch);
      report.set_shard(b);
      report.set_reason(what);
      proto::ReportDownResponse ignored;
      absl::Status reported = ReportDown(report, &ignored);
      if (!reported.ok()) log::Warn("shard {}: reporting shard {} down: {}", self, b, reported.ToString());
    }
    absl::MutexLock lock(&mu_);
    if (epoch_.load() != epoch) return absl::AbortedError(SupersededMessage(epoch));
    return absl::UnavailableError(absl::StrCat(what, "; retry"));
  }
  ++replications_sent_;
  return absl::OkStatus();
}

absl::Status ShardService::AcceptReplica(const proto::ReplicateRequest& r) {
  if (absl::Status s = CheckJob(r.job(), /*name_ours=*/false); !s.ok()) return s;
  const proto::ChunkState& part = r.part();
  if (replicas_ < 2) {
    return absl::FailedPreconditionError("this job keeps no replicas (config replicas: 1)");
  }
  if (absl::Status s = CheckKey(part.key()); !s.ok()) return s;
  // A fenced backup is no copy: the owner must not count it.
  if (absl::Status s = CheckMayAcknowledge(); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("shard shutting down");
  if (absl::Status s = CheckPeerEpochLocked(r.shard_map_epoch()); !s.ok()) return s;
  // Any phase will do: while a re-shard is prepared or committed the old map (this epoch)
  // still runs its steps, and they are replicated as always.
  auto it = tensors_.find(part.key());
  if (it == tensors_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("replicated chunk of tensor '", part.key(), "', not declared here"));
  }
  Tensor& t = *it->second;
  if (absl::Status s = t.CheckChunk(part.chunk()); !s.ok()) return s;
  auto backup = t.backups.find(part.chunk());
  if (backup == t.backups.end() || t.owner[part.chunk()] != r.from_shard()) {
    return absl::FailedPreconditionError(absl::StrCat(
        t.OwnedBy(part.chunk()), " and not backed up by shard ", shard(), " under epoch ",
        epoch_.load(), "; a replica from shard ", r.from_shard(), " is refused"));
  }
  // Each array of a part is at most one chunk's encoded size, so a peer cannot make this
  // shard hold more per backed-up chunk than its budgeted state.
  if (absl::Status s =
          CheckChunkStatePart(part, t.layout.size(part.chunk()), MaxNameBytes(), "replicated part");
      !s.ok()) {
    return s;
  }
  TensorBackup& b = backup->second;
  // Only the parts of chunks this shard backs up are held, so what a sender can make it
  // buffer is bounded by this shard's own (budgeted) state. The owner sends a state's
  // first part first: whatever an interrupted earlier state left is dropped then.
  if (part.has_value()) b.partial.Clear();
  MergeChunkStatePart(part, &b.partial);
  if (!r.completes_chunk()) return absl::OkStatus();
  proto::ChunkState whole = std::move(b.partial);
  b.partial.Clear();
  if (whole.key() != part.key() || whole.chunk() != part.chunk() ||
      whole.elements() != t.layout.size(part.chunk()) || !whole.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("replicated state of '", part.key(),
                                                   "' chunk ", part.chunk(),
                                                   " is incomplete or of another size"));
  }
  b.state = std::move(whole);
  b.has_state = true;
  b.synced = true;
  b.initial = std::vector<float>();
  return absl::OkStatus();
}

absl::Status ShardService::ReportDown(const proto::ReportDownRequest& r,
                                      proto::ReportDownResponse* response) {
  if (absl::Status s = CheckJob(r.job(), /*name_ours=*/false); !s.ok()) return s;
  if (replicas_ < 2) {
    return absl::FailedPreconditionError("this job keeps no replicas (config replicas: 1): "
                                         "a shard that is down stays down");
  }
  // One coordination at a time. The reports of one failover (each shard's and worker's)
  // wait for it and then find it done; past kMaxFailoverWaiters they are answered at once,
  // since each waiting call holds a request thread (a flood of reports took them all).
  // The running coordination probes every peer, so it finds any shard they report.
  if (failover_waiters_.fetch_add(1) >= kMaxFailoverWaiters) {
    failover_waiters_.fetch_sub(1);
    return absl::UnavailableError(
        absl::StrCat("more than ", kMaxFailoverWaiters,
                     " down reports wait for the failover being coordinated here; look for "
                     "its map, or report again"));
  }
  absl::Status s;
  {
    absl::MutexLock failover(&failover_mu_);
    s = CoordinateFailover(r);
  }
  failover_waiters_.fetch_sub(1);
  absl::MutexLock lock(&mu_);
  response->set_shard_map_epoch(epoch_.load());
  *response->mutable_down_shards() = map_config_.down_shards();
  return s;
}

absl::Status ShardService::CoordinateFailover(const proto::ReportDownRequest& r) {
  proto::ClusterConfig current;
  uint32_t self = 0;
  {
    absl::MutexLock lock(&mu_);
    current = map_config_;
    self = shard_index_.load();
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
    if (phase_ != Phase::kServing || rejoining_) {
      return absl::UnavailableError("this shard cannot coordinate now (re-sharding or "
                                    "rejoining); report again later");
    }
  }
  const uint32_t n = current.shards_size();
  if (r.shard() >= n) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", r.shard(), " out of range: the map has ",
                                                   n, " shards"));
  }
  std::vector<bool> down(n, false);
  for (uint32_t k : current.down_shards()) down[k] = true;
  if (down[r.shard()] || r.shard_map_epoch() < current.shard_map_epoch()) {
    return absl::OkStatus();  // handled already, or reported under an older map
  }
  auto probe = [this](const std::string& address) {
    return options_.peers.probe ? options_.peers.probe(address, kProbeTimeout)
                          : absl::FailedPreconditionError("no transport to probe peers");
  };
  ClusterState* const state = options_.cluster_state;
  if (state != nullptr) {
    // Only the coordinator etcd elected decides, and it watches the leases itself: a report
    // to another shard needs no forwarding (forwarding it to a coordinator that had just
    // died held this shard's failover for the call's whole deadline).
    // The cached answer: a report costs no etcd call (CommitMap checks the leadership).
    if (!state->Leading()) return absl::OkStatus();
    // Down means holding no lease: a shard that holds one is alive, whatever one peer
    // could or could not reach.
    std::vector<uint32_t> dead;
    for (uint32_t i = 0; i < n; ++i) {
      if (!down[i] && i != self && !state->IsLive(i)) dead.push_back(i);
    }
    if (dead.empty()) return absl::OkStatus();
    proto::ClusterConfig next = current;
    for (uint32_t k : dead) down[k] = true;
    SetShardList(down, next.mutable_down_shards());
    next.set_shard_map_epoch(next.shard_map_epoch() + 1);
    return DistributeMap(std::move(next), absl::StrCat("reported: ", log::Clip(r.reason())));
  }
  // The coordinator is the lowest live shard that answers; a forwarded report is handled
  // where it arrives, so that two shards that see each other differently cannot bounce it.
  if (!r.forwarded() && options_.peers.report_down) {
    for (uint32_t i = 0; i < n && i != self; ++i) {
      if (down[i] || i == r.shard() || !probe(current.shards(i)).ok()) continue;
      proto::ReportDownRequest forward = r;
      forward.set_forwarded(true);
      proto::ReportDownResponse ignored;
      return options_.peers.report_down(current.shards(i), forward, &ignored);
    }
  }
  // Probe every live peer at once; those that do not answer are down.
  std::vector<uint32_t> peers;
  for (uint32_t i = 0; i < n; ++i) {
    if (!down[i] && i != self) peers.push_back(i);
  }
  std::vector<absl::Status> answers(peers.size());
  {
    std::vector<std::thread> probes;
    for (size_t p = 0; p < peers.size(); ++p) {
      probes.emplace_back([&, p] { answers[p] = probe(current.shards(peers[p])); });
    }
    for (std::thread& t : probes) t.join();
  }
  // Down means no answer at all: a peer that refuses as busy (every request thread taken,
  // as a flood of calls can make any shard) is alive, and failing it over would leave two
  // shards serving its chunks.
  std::vector<uint32_t> dead;
  for (size_t p = 0; p < peers.size(); ++p) {
    if (IsPeerGone(answers[p])) dead.push_back(peers[p]);
  }
  if (dead.empty()) {
    static log::LineBudget* const budget = new log::LineBudget(10, "reports of live shards");
    if (budget->Admit()) {
      log::Info("shard {}: shard {} was reported down ({}), but every shard answers", self,
                r.shard(), log::Clip(r.reason()));
    }
    return absl::OkStatus();
  }
  proto::ClusterConfig next = current;
  for (uint32_t k : dead) down[k] = true;
  SetShardList(down, next.mutable_down_shards());
  next.set_shard_map_epoch(next.shard_map_epoch() + 1);
  return DistributeMap(std::move(next), absl::StrCat("reported: ", log::Clip(r.reason())));
}

absl::Status ShardService::DistributeMap(proto::ClusterConfig next, const std::string& why) {
  const uint32_t n = next.shards_size();
  uint32_t self = 0;
  proto::InstallMapRequest install;
  {
    absl::MutexLock lock(&mu_);
    self = shard_index_.load();
    // Every tensor, for a joining shard that restarted empty.
    for (const auto& [key, t] : tensors_) *install.add_declarations() = t->Declaration(config_);
  }
  std::vector<bool> down(n, false), joining(n, false);
  for (uint32_t k : next.down_shards()) down[k] = true;
  for (uint32_t k : next.joining_shards()) joining[k] = true;
  install.set_from_shard(self);
  ClusterState* const state = options_.cluster_state;
  for (int round = 0; round < kMaxInstallRounds; ++round) {
    *install.mutable_map() = next;
    if (state != nullptr) {
      // The decision is committed in etcd before anyone acts on it: of two coordinators
      // only one can move the map from this epoch, and a successor finds it there.
      proto::ClusterConfig from;
      {
        absl::MutexLock lock(&mu_);
        from = map_config_;
      }
      if (absl::Status s = state->CommitMap(from, next); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("committing epoch ", next.shard_map_epoch(),
                                                   " in etcd: ", s.message()));
      }
    }
    // One line per decision (the launcher counts them): with etcd, only once committed.
    log::Warn("shard {}: failover to epoch {}: down [{}], joining [{}] ({})", self,
              next.shard_map_epoch(), absl::StrJoin(next.down_shards(), ", "),
              absl::StrJoin(next.joining_shards(), ", "), why);
    std::vector<uint32_t> dead;
    for (uint32_t i = 0; i < n; ++i) {
      if (down[i] || i == self) continue;
      absl::Status s = options_.peers.install_map
                           ? options_.peers.install_map(next.shards(i), install)
                           : absl::FailedPreconditionError("no transport to install maps");
      if (IsPeerGone(s) && state != nullptr) {
        // Committed already: a shard that holds its lease installs it from its watch; one
        // that does not is failed over by the coordinator's next look at the leases.
        continue;
      }
      if (IsPeerGone(s)) {
        dead.push_back(i);
      } else if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("installing epoch ", next.shard_map_epoch(),
                                                   " on shard ", i, ": ", s.message()));
      }
    }
    if (dead.empty()) return InstallMap(install);
    // Down during the install: out of the map too, under a newer epoch.
    for (uint32_t k : dead) {
      down[k] = true;
      joining[k] = false;
    }
    SetShardList(down, next.mutable_down_shards());
    SetShardList(joining, next.mutable_joining_shards());
    next.set_shard_map_epoch(next.shard_map_epoch() + 1);
  }
  return absl::UnavailableError("shards keep failing while a failover installs its map");
}

absl::Status ShardService::Rejoin(const proto::RejoinRequest& r, proto::RejoinResponse* response) {
  if (absl::Status s = CheckJob(r.job(), /*name_ours=*/false); !s.ok()) return s;
  if (replicas_ < 2) {
    return absl::FailedPreconditionError("this job keeps no replicas (config replicas: 1)");
  }
  absl::MutexLock failover(&failover_mu_);
  for (int pass = 0; pass < 2; ++pass) {
    proto::ClusterConfig current;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_ || rejoining_ || phase_ != Phase::kServing) {
        return absl::UnavailableError("this shard cannot coordinate now; ask another");
      }
      current = map_config_;
      if (r.shard() >= static_cast<uint32_t>(current.shards_size()) || r.shard() == shard()) {
        return absl::InvalidArgumentError(absl::StrCat("shard ", r.shard(), " cannot rejoin here"));
      }
    }
    const uint32_t n = current.shards_size(), k = r.shard();
    std::vector<bool> down(n, false), joining(n, false);
    for (uint32_t i : current.down_shards()) down[i] = true;
    for (uint32_t i : current.joining_shards()) joining[i] = true;
    // Before the map changes on the request's word, the shard it names must confirm it.
    if (pass == 0 && r.caught_up() == joining[k]) {
      if (absl::Status s = CheckRejoinClaim(current.shards(k), k, r.caught_up()); !s.ok()) {
        return s;
      }
    }
    proto::ClusterConfig next = current;
    next.set_shard_map_epoch(current.shard_map_epoch() + 1);
    std::string why;
    if (r.caught_up()) {
      if (!joining[k]) break;  // done already
      joining[k] = false;
      why = absl::StrCat("shard ", k, " caught up and takes its chunks back");
    } else if (joining[k]) {
      // Either a resent request, or the shard restarted again while it caught up (a second
      // fault in the transition): then it is empty and waits for the map that makes it
      // join, which nobody would send again. The map is sent to it again (a shard that has
      // it answers that at once); the epoch need not change, since it owns nothing yet.
      proto::InstallMapRequest again;
      {
        absl::MutexLock lock(&mu_);
        for (const auto& [key, t] : tensors_) *again.add_declarations() = t->Declaration(config_);
      }
      *again.mutable_map() = current;
      again.set_from_shard(shard());
      if (!options_.peers.install_map) {
        return absl::FailedPreconditionError("no transport to install maps");
      }
      if (absl::Status s = options_.peers.install_map(current.shards(k), again); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("sending shard ", k, " its joining map again: ",
                                                   s.message()));
      }
      break;
    } else if (!down[k]) {
      // Restarted before anyone noticed: its memory is gone, so its chunks fail over first.
      down[k] = true;
      why = absl::StrCat("shard ", k, " restarted with empty memory");
    } else {
      down[k] = false;
      joining[k] = true;
      why = absl::StrCat("shard ", k, " restarted and catches up");
    }
    SetShardList(down, next.mutable_down_shards());
    SetShardList(joining, next.mutable_joining_shards());
    if (absl::Status s = DistributeMap(std::move(next), why); !s.ok()) return s;
    if (r.caught_up() || joining[k]) break;  // else: the second pass takes it in
  }
  absl::MutexLock lock(&mu_);
  response->set_shard_map_epoch(epoch_.load());
  return absl::OkStatus();
}

absl::Status ShardService::CheckRejoinClaim(const std::string& address, uint32_t k,
                                            bool caught_up) {
  // Only the shard itself knows that it restarted or caught up: asked, so that a caller
  // naming another shard (anyone holding the job token) cannot take a live shard's chunks
  // away or hand chunks back to one that does not hold them.
  if (!options_.peers.status) {
    return absl::FailedPreconditionError(absl::StrCat("no transport to ask shard ", k));
  }
  absl::StatusOr<proto::ReshardStatusResponse> st = options_.peers.status(address, kProbeTimeout);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat("shard ", k, " does not answer (",
                                               st.status().message(),
                                               "); only a shard that answers is taken back"));
  }
  if (!caught_up && st->state() != "rejoining") {
    return absl::FailedPreconditionError(absl::StrCat("shard ", k, " did not restart (it reports '",
                                                      st->state(), "'): rejoin refused"));
  }
  if (caught_up && !st->caught_up()) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", k, " has not caught up: its chunks stay with their backups"));
  }
  return absl::OkStatus();
}

bool ShardService::CaughtUpLocked() const {
  const uint32_t self = shard_index_.load();
  if (!joining_shards_[self]) return false;
  for (const auto& [key, t] : tensors_) {
    for (const auto& [c, b] : t->backups) {
      if (!b.synced) return false;
    }
  }
  return true;
}

absl::Status ShardService::EnterJob() {
  const std::string& dir = checkpoint_dir_;
  if (absl::Status s = RefuseSetsOutsideTheJobDir(); !s.ok()) return s;
  if (options_.cluster_state == nullptr) {
    return dir.empty() ? absl::OkStatus() : RestoreFromCheckpoint();
  }
  if (!dir.empty()) {
    if (absl::Status s = CheckCheckpointDirWritable(dir); !s.ok()) return s;
  }
  absl::StatusOr<coord::RunEntry> entry = EnterRunAndRestore();
  if (!entry.ok()) return entry.status();
  // A rejoin with single copies: as without etcd, the newest set this shard can restore
  // (replicated, the state comes back from the other copies).
  if (entry->kind == coord::RunEntry::Kind::kRejoin && replicas_ < 2 && !dir.empty()) {
    return RestoreFromCheckpoint();
  }
  return absl::OkStatus();
}

absl::StatusOr<coord::RunEntry> ShardService::EnterRunAndRestore() {
  const std::string& dir = checkpoint_dir_;
  // Only a shard that starts a run chooses the set, and has loaded it by then.
  std::optional<LoadedCheckpoint> chosen;
  CheckedStates checked;
  const auto newest = [&]() -> absl::StatusOr<std::string> {
    if (dir.empty()) return std::string();
    absl::StatusOr<LoadedCheckpoint> l = LoadForRestore("", &checked);
    if (absl::IsNotFound(l.status())) return std::string();
    if (!l.ok()) return l.status();
    chosen = *std::move(l);
    return CheckpointSetName(chosen->final, chosen->step, chosen->shards);
  };
  absl::StatusOr<coord::RunEntry> entry = options_.cluster_state->EnterRun(newest);
  if (!entry.ok()) {
    return absl::Status(entry.status().code(), absl::StrCat("entering the job's run in etcd: ",
                                                            entry.status().message()));
  }
  const proto::RunRecord& run = entry->run;
  log::Info("shard {}: {} {} of job {} (started by {}; restores {})", shard(),
            coord::RunEntryKindName(entry->kind), run.generation(), config_.job(), run.started_by(),
            run.restore_set().empty() ? "nothing" : run.restore_set());
  {
    absl::MutexLock lock(&mu_);
    run_generation_ = run.generation();
    run_says_rejoin_ = entry->kind == coord::RunEntry::Kind::kRejoin;
  }
  if (entry->kind == coord::RunEntry::Kind::kRejoin || run.restore_set().empty()) return entry;
  if (dir.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job's run restores checkpoint set ", run.restore_set(), " (chosen by ",
        run.started_by(), "), but this shard's config has no checkpoint.dir"));
  }
  if (!chosen.has_value()) {
    absl::StatusOr<LoadedCheckpoint> l = LoadForRestore(run.restore_set(), &checked);
    if (!l.ok()) return l.status();
    chosen = *std::move(l);
  }
  {
    absl::MutexLock lock(&mu_);
    restoring_thread_ = std::this_thread::get_id();
  }
  absl::Status restored = RestoreLoaded(*std::move(chosen), std::move(checked));
  absl::MutexLock lock(&mu_);
  restoring_thread_ = std::thread::id();
  if (!restored.ok()) return restored;
  return entry;
}

bool ShardService::EnterNextRun() {
  if (options_.cluster_state == nullptr) return false;
  {
    absl::MutexLock lock(&mu_);
    if (!run_says_rejoin_) return false;
  }
  absl::StatusOr<coord::RunEntry> entry = EnterRunAndRestore();
  absl::MutexLock lock(&mu_);
  // etcd not answering, or the run still going on: rejoin as before.
  if (run_says_rejoin_) return false;
  if (!entry.ok()) {
    // Serving half a set would be worse than not serving: stay out, and say why.
    log::Error("shard {}: entering run {} after the one it rejoined stopped: {}; this shard "
               "does not serve",
               shard(), run_generation_, entry.status().ToString());
    return true;
  }
  log::Warn("shard {}: every shard of the run it rejoined stopped; it {} {}", shard(),
            coord::RunEntryKindName(entry->kind), run_generation_);
  rejoining_ = false;
  return true;
}

void ShardService::HoldForRejoinCheck() {
  if (replicas_ < 2) return;
  absl::MutexLock lock(&mu_);
  // With etcd the run record has decided already: only a restart into a running run waits.
  if (options_.cluster_state != nullptr && !run_says_rejoin_) return;
  rejoining_ = true;
}

void ShardService::StartRejoinCheck() {
  if (replicas_ < 2) return;
  absl::MutexLock lock(&rejoin_thread_mu_);
  if (rejoin_thread_.joinable()) rejoin_thread_.join();  // an earlier rejoin, finished
  rejoin_thread_ = std::thread([this] { RejoinLoop(); });
}

void ShardService::RejoinLoop() {
  uint32_t self = 0;
  uint64_t own_epoch = 0;
  proto::ClusterConfig map;
  {
    absl::MutexLock lock(&mu_);
    self = shard_index_.load();
    own_epoch = epoch_.load();
    map = map_config_;
  }
  // A job runs if a peer has tensors or a newer map; then this shard restarted into it,
  // unless its own map is newer than every peer's (a shard a re-shard adds starts with the
  // new config and waits for the re-shard instead). No answer proves nothing, so this
  // asks until some peer shows a running job or every peer has answered: a fresh job
  // cannot start before all its shards are up anyway, and a restarted shard must never
  // take an unanswered question for a fresh start.
  std::vector<bool> answered(map.shards_size(), false);
  answered[self] = true;
  bool running = false;
  uint64_t newest_peer_epoch = 0;
  if (options_.cluster_state != nullptr) {
    // Decided from the run record (EnterJob): no peer is asked.
    absl::MutexLock lock(&mu_);
    if (!run_says_rejoin_) return;
    running = true;
    std::fill(answered.begin(), answered.end(), true);
  }
  absl::Duration backoff = absl::Milliseconds(100);
  while (!running && std::find(answered.begin(), answered.end(), false) != answered.end()) {
    for (int i = 0; i < map.shards_size() && options_.peers.status; ++i) {
      if (answered[i]) continue;
      absl::StatusOr<proto::ReshardStatusResponse> st =
          options_.peers.status(map.shards(i), kProbeTimeout);
      if (!st.ok()) continue;
      answered[i] = true;
      newest_peer_epoch = std::max(newest_peer_epoch, st->shard_map_epoch());
      if (st->tensors() > 0 || st->shard_map_epoch() > own_epoch) running = true;
    }
    if (running || !options_.peers.status) break;
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutting_down_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stop), backoff)) return;
    backoff = std::min(backoff * 2, absl::Seconds(1));
  }
  if (!running || (options_.cluster_state == nullptr && own_epoch > newest_peer_epoch)) {
    absl::MutexLock lock(&mu_);
    rejoining_ = false;
    return;
  }
  log::Warn("shard {}: restarted while the job runs on its peers; rejoining", self);
  auto ask = [&](bool caught_up) {
    proto::RejoinRequest req;
    req.set_job(config_.job());
    req.set_shard(self);
    req.set_caught_up(caught_up);
    absl::Duration backoff = absl::Milliseconds(50);
    while (true) {
      // The coordinator is the lowest live shard; others refuse or are down.
      for (int i = 0; i < map.shards_size(); ++i) {
        if (static_cast<uint32_t>(i) == self || !options_.peers.rejoin) continue;
        proto::RejoinResponse resp;
        absl::Status s = options_.peers.rejoin(map.shards(i), req, &resp);
        if (s.ok()) return true;
        log::Info("shard {}: rejoin request to shard {}: {}", self, i, s.ToString());
      }
      // Nobody to rejoin any more (every shard of the run stopped): the next run.
      if (!caught_up && EnterNextRun()) return false;
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutting_down_; };
      if (mu_.AwaitWithTimeout(absl::Condition(&stop), backoff)) return false;
      backoff = std::min(backoff * 2, absl::Seconds(2));
    }
  };
  if (!ask(false)) return;
  {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || CaughtUpLocked();
    };
    mu_.Await(absl::Condition(&ready));
    if (shutting_down_) return;
    log::Info("shard {}: caught up ({} tensors); asking to take its chunks back", self,
              tensors_.size());
  }
  ask(true);
}

absl::Status ShardService::PromoteLocked(Tensor* t, uint32_t chunk, TensorBackup backup,
                                        uint64_t epoch) {
  std::shared_ptr<StepAccumulator> acc = MakeAccumulator(*t, chunk);
  if (backup.has_state) {
    absl::StatusOr<ChunkSnapshot> snap =
        ChunkStateFromProto(backup.state, t->layout.size(chunk), t->dtype);
    if (!snap.ok()) return snap.status();
    StampEpoch(epoch, &*snap);
    if (absl::Status s = acc->Restore(*std::move(snap)); !s.ok()) return s;
  } else {
    // No step completed yet: the declared initial value, sent on to the new backups.
    if (!backup.initial.empty()) acc->SetInitial(backup.initial);
    acc->RequireReplication();
  }
  t->chunks[chunk] = std::move(acc);
  return absl::OkStatus();
}

absl::Status ShardService::InstallMap(const proto::InstallMapRequest& request) {
  // Only failover installs maps this way; without replicas no shard ever sends one, and
  // a map with shards down would leave their chunks without an owner.
  if (replicas_ < 2) {
    return absl::FailedPreconditionError(
        "this job keeps no replicas (config replicas: 1): no failover map is installed");
  }
  const proto::ClusterConfig& next = request.map();
  if (absl::Status s = cluster::ValidateClusterConfig(next); !s.ok()) return s;
  // The coordinator is a live shard of the map it sends (the one that confirmed the
  // down reports), neither down nor joining (a joining shard holds no state of its own).
  const auto lists = [&](const auto& shards) {
    return std::find(shards.begin(), shards.end(), request.from_shard()) != shards.end();
  };
  if (request.from_shard() >= static_cast<uint32_t>(next.shards_size()) ||
      lists(next.down_shards()) || lists(next.joining_shards())) {
    return absl::InvalidArgumentError(absl::StrCat("from_shard ", request.from_shard(),
                                                   " is not a live shard of the map it sends"));
  }
  std::vector<std::shared_ptr<StepAccumulator>> dropped;
  absl::Status dropped_status;
  uint64_t taken_back_in_run = 0;  // set when this install ends a rejoin (with etcd: its run)
  bool rejoin_again = false;       // with etcd: this shard was taken out while alive
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
    if (next.job() != config_.job() || cluster::Replicas(next) != replicas_ ||
        !std::equal(next.shards().begin(), next.shards().end(), map_config_.shards().begin(),
                    map_config_.shards().end())) {
      return absl::InvalidArgumentError(
          "a failover's map must keep the job, the shards and replicas of the running one");
    }
    if (next.shard_map_epoch() == epoch_.load() &&
        std::equal(next.down_shards().begin(), next.down_shards().end(),
                   map_config_.down_shards().begin(), map_config_.down_shards().end())) {
      return absl::OkStatus();  // a resent install
    }
    if (next.shard_map_epoch() <= epoch_.load()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "epoch ", next.shard_map_epoch(), " is not above this shard's ", epoch_.load()));
    }
    if (phase_ != Phase::kServing) {
      return absl::FailedPreconditionError("a re-shard is under way on this shard");
    }
    const uint32_t self = shard_index_.load();
    const uint64_t epoch = next.shard_map_epoch();
    std::vector<bool> down(next.shards_size(), false), joining(next.shards_size(), false);
    for (uint32_t k : next.down_shards()) down[k] = true;
    for (uint32_t k : next.joining_shards()) joining[k] = true;
    left_epoch_ = epoch_.load();
    map_config_ = next;
    shard_map_ = cluster::ShardMap(next.shards_size(), epoch);
    down_ = down;
    joining_shards_ = joining;
    ++failovers_;
    if (!down[self] && rejoining_) {
      // Restarted: taken back as a joining shard. Its memory is empty, so it learns the
      // job's tensors here and backs their chunks up until their owners' states arrive.
      rejoining_ = false;
      run_says_rejoin_ = false;
      taken_back_in_run = run_generation_;
      for (const proto::TensorDeclaration& d : request.declarations()) {
        if (tensors_.contains(d.key())) continue;
        absl::StatusOr<codec::DType> dt = cluster::FromProto(d.dtype());
        absl::StatusOr<cluster::OptimizerOptions> opt = OptimizerFrom(d.optimizer());
        if (!dt.ok() || !opt.ok() || d.chunk_bytes() != config_.chunk_bytes() ||
            CheckKey(d.key()).ok() == false) {
          return absl::InvalidArgumentError(absl::StrCat("bad declaration of '", d.key(), "'"));
        }
        proto::DeclareTensorRequest req;
        req.set_key(d.key());
        req.set_elements(d.elements());
        *req.mutable_optimizer() = d.optimizer();
        absl::StatusOr<Tensor*> t = DeclareLocked(req, *dt, *opt, /*fresh=*/false);
        if (!t.ok()) return t.status();
      }
    }
    const bool fenced = down[self];
    if (fenced && options_.cluster_state != nullptr) {
      // Alive but counted out (its lease ended: paused, cut off): it must not serve a chunk
      // a backup has taken over, and it holds nothing the others lack. It comes back as a
      // restarted shard does: rejoining, then catching up from the owners.
      rejoining_ = true;
      run_says_rejoin_ = true;
      rejoin_again = true;
      dropped_status = absl::UnavailableError(absl::StrCat(
          "this shard (", self_address_, ") was failed over in epoch ", epoch,
          " and is rejoining; its chunks are served by other shards"));
    } else if (fenced) {
      // Alive but counted out (it did not answer in time): it must not serve a chunk that
      // a backup has taken over.
      SetPhaseLocked(Phase::kDrained);
      dropped_status = absl::FailedPreconditionError(absl::StrCat(
          "this shard (", self_address_, ") was failed over in epoch ", epoch,
          "; its chunks are served by other shards"));
    } else {
      dropped_status = absl::AbortedError(SupersededMessage(left_epoch_));
    }
    uint64_t owned = 0, promoted = 0, lost = 0;
    for (auto& [key, t] : tensors_) {
      const std::vector<uint32_t> old_live = t->live;
      absl::flat_hash_map<uint32_t, TensorBackup> released = AssignRolesLocked(t.get());
      for (uint32_t c = 0; c < t->layout.num_chunks; ++c) {
        auto acc = t->chunks.find(c);
        if (fenced || t->owner[c] != self) {
          if (acc != t->chunks.end()) {
            // Handing the chunk to another owner (a rejoined shard taking it back) and
            // backing it up: the state this shard holds is the backup's, at once. Starting
            // the backup empty left one copy until the new owner's next step, and a second
            // fault in that window lost the chunk.
            auto backup = t->backups.find(c);
            if (!fenced && backup != t->backups.end() && !backup->second.synced) {
              proto::ChunkState state;
              if (ChunkStateToProto(config_.job(), key, c, t->layout.size(c),
                                    acc->second->Snapshot(), &state)
                      .ok()) {
                backup->second.state = std::move(state);
                backup->second.has_state = true;
                backup->second.synced = true;
              }
            }
            dropped.push_back(acc->second);
            t->chunks.erase(acc);
          }
          continue;
        }
        if (acc != t->chunks.end()) {
          // Still the owner: changed backups get the state before the next answer.
          if (!std::equal(&old_live[c * replicas_], &old_live[(c + 1) * replicas_],
                          &t->live[c * replicas_])) {
            acc->second->RequireReplication();
          }
          continue;
        }
        if (t->lost.contains(c)) continue;
        auto held = released.find(c);
        absl::Status s =
            held == released.end() || !held->second.synced
                ? absl::DataLossError("no copy of its state reached this shard")
                : PromoteLocked(t.get(), c, std::move(held->second), epoch);
        if (s.ok()) {
          ++promoted;
          continue;
        }
        // The copies lost: down shards of the last map, and those this shard's unsynced
        // backup stood in for (two shards lost one map apart).
        std::vector<uint32_t> lost_on;
        if (held != released.end() && !held->second.synced) lost_on = held->second.replaced;
        for (uint32_t j = 0; j < replicas_; ++j) {
          const uint32_t k = old_live[c * replicas_ + j];
          if (k != cluster::ShardMap::kNone && down[k]) lost_on.push_back(k);
        }
        std::sort(lost_on.begin(), lost_on.end());
        lost_on.erase(std::unique(lost_on.begin(), lost_on.end()), lost_on.end());
        std::vector<std::string> holders;
        for (uint32_t k : lost_on) holders.push_back(ShardName(k));
        t->lost[c] = absl::StrCat(
            "chunk ", c, " of '", key, "' is lost: every copy of its state was on ",
            absl::StrJoin(holders, " and "), ", now down (", s.message(),
            "); restart the job from its newest checkpoint");
        if (lost < kLostChunksLogged) log::Error("shard {}: {}", self, t->lost[c]);
        ++lost;
      }
      owned += t->chunks.size();
    }
    chunks_promoted_ += promoted;
    chunks_lost_ += lost;
    metrics_->CountFailover();
    metrics_->CountChunksPromoted(promoted);
    metrics_->CountChunksLost(lost);
    metrics_->SetReplication(next.down_shards_size(), next.down_shards_size() > 0);
    epoch_ = epoch;
    chunks_owned_ = owned;
    metrics_->SetTensors(tensors_.size(), owned, epoch);
    log::Warn("shard {}: installed epoch {} (down: [{}]): {} chunks taken over, {} lost{}", self,
              epoch, absl::StrJoin(next.down_shards(), ", "), promoted, lost,
              fenced ? "; this shard is out of the map" : "");
  }
  // Outside mu_: accumulators take their own locks.
  for (const auto& acc : dropped) acc->Cancel(dropped_status);
  if (rejoin_again) {
    log::Warn("shard {}: taken out of the map while alive (its lease ended); rejoining", shard());
    StartRejoinCheck();
  }
  if (taken_back_in_run != 0 && options_.cluster_state != nullptr) {
    // Serving in the run again: a later restart of the others finds a running job here.
    if (absl::Status s = options_.cluster_state->MarkServing(taken_back_in_run); !s.ok()) {
      log::Warn("shard {}: marking itself serving in run {} in etcd: {}", shard(),
                taken_back_in_run, s.ToString());
    }
  }
  return absl::OkStatus();
}


absl::Status ShardService::CheckMayAcknowledge() const {
  return options_.cluster_state != nullptr ? options_.cluster_state->CheckLease()
                                           : absl::OkStatus();
}

void ShardService::OnCommittedMap(const proto::ShardMapRecord& record) {
  proto::InstallMapRequest install;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_ || rejoining_ || phase_ != Phase::kServing ||
        record.epoch() <= epoch_.load()) {
      return;
    }
    if (!std::equal(record.shards().begin(), record.shards().end(), map_config_.shards().begin(),
                    map_config_.shards().end())) {
      return;  // a re-shard's map: its own protocol installs it
    }
    proto::ClusterConfig next = map_config_;
    next.set_shard_map_epoch(record.epoch());
    *next.mutable_down_shards() = record.down_shards();
    *next.mutable_joining_shards() = record.joining_shards();
    *install.mutable_map() = std::move(next);
    install.set_from_shard(record.written_by_shard() >= 0
                               ? static_cast<uint32_t>(record.written_by_shard())
                               : shard_index_.load());
  }
  if (absl::Status s = InstallMap(install); !s.ok()) {
    log::Warn("shard {}: installing epoch {} committed in etcd: {}", shard(), record.epoch(),
              s.ToString());
  }
}

void ShardService::OnMemberLost(uint32_t k, const std::string& why) {
  proto::ReportDownRequest report;
  report.set_job(config_.job());
  report.set_shard_map_epoch(epoch_.load());
  report.set_shard(k);
  report.set_reason(absl::StrCat("shard ", k, " lost: ", why));
  report.set_forwarded(true);  // this shard coordinates: decide here
  proto::ReportDownResponse ignored;
  if (absl::Status s = ReportDown(report, &ignored); !s.ok()) {
    log::Warn("shard {}: failing shard {} over ({}): {}", shard(), k, why, s.ToString());
  }
}

}  // namespace gcomp::server
