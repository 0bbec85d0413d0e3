#include "server/cluster_state.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/logging.h"
#include "cluster/cluster_config.h"
#include "coord/etcd_store.h"

namespace gcomp::server {
namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  return (uint64_t{rd()} << 32) ^ rd() ^ static_cast<uint64_t>(absl::ToUnixNanos(absl::Now()));
}

bool Lists(const google::protobuf::RepeatedField<uint32_t>& list, uint32_t k) {
  return std::find(list.begin(), list.end(), k) != list.end();
}

}  // namespace

proto::ShardMapRecord ClusterState::RecordOf(const proto::ClusterConfig& map,
                                             const std::string& by) {
  proto::ShardMapRecord r;
  r.set_epoch(map.shard_map_epoch());
  *r.mutable_shards() = map.shards();
  r.set_replicas(cluster::Replicas(map));
  *r.mutable_down_shards() = map.down_shards();
  *r.mutable_joining_shards() = map.joining_shards();
  r.set_written_by(by);
  r.set_written_by_shard(-1);
  return r;
}

ClusterState::ClusterState(const proto::ClusterConfig& config, ClusterStateOptions options,
                           std::shared_ptr<coord::Store> store)
    : config_(config),
      options_(std::move(options)),
      keys_(config.job()),
      name_(absl::StrCat("shard ", options_.shard)),
      incarnation_(NewIncarnation()),
      store_(std::move(store)),
      tick_(options_.tick > absl::ZeroDuration()
                ? options_.tick
                : absl::Milliseconds(config.coordination().lease_ttl_ms()) / 3) {}

absl::StatusOr<proto::ClusterConfig> ClusterState::WithJobMap(const proto::ClusterConfig& config,
                                                             uint32_t shard, coord::Store* store) {
  if (config.coordination().etcd().empty() && store == nullptr) return config;
  std::unique_ptr<coord::EtcdStore> own;
  if (store == nullptr) {
    absl::StatusOr<std::unique_ptr<coord::EtcdStore>> etcd =
        coord::EtcdStore::Create(coord::EtcdStoreOptionsFrom(config.coordination()));
    if (!etcd.ok()) return etcd.status();
    own = *std::move(etcd);
    store = own.get();
  }
  absl::StatusOr<std::optional<coord::VersionedMap>> map = coord::ReadMap(store, config.job());
  if (!map.ok()) return map.status();
  absl::StatusOr<std::optional<coord::VersionedReshard>> reshard =
      coord::ReadReshard(store, config.job());
  if (!reshard.ok()) return reshard.status();
  const bool in_file = shard < static_cast<uint32_t>(config.shards_size());
  if (!map->has_value()) return config;  // the job's first start: the file's map
  const proto::ShardMapRecord& committed = (*map)->record;
  const bool in_committed = shard < static_cast<uint32_t>(committed.shards_size());
  proto::ClusterConfig out = config;
  if (reshard->has_value() && !coord::Finished((*reshard)->record)) {
    const proto::ClusterConfig& next = (*reshard)->record.next();
    const bool added = shard < static_cast<uint32_t>(next.shards_size()) &&
                       (!in_committed || committed.shards(shard) != next.shards(shard));
    if (added && next.shard_map_epoch() > committed.epoch()) {
      out.mutable_shards()->CopyFrom(next.shards());
      out.set_shard_map_epoch(next.shard_map_epoch());
      out.clear_down_shards();
      out.clear_joining_shards();
      log::Info("shard {}: the job's re-shard to epoch {} (in etcd) adds this shard: starting "
                "with its map of {} shards", shard, next.shard_map_epoch(), next.shards_size());
      return out;
    }
  }
  const bool same = std::equal(config.shards().begin(), config.shards().end(),
                               committed.shards().begin(), committed.shards().end());
  if (!same && committed.epoch() > config.shard_map_epoch() && in_committed) {
    out.mutable_shards()->CopyFrom(committed.shards());
    log::Info("shard {}: the config file lists {} shards, the job's map in etcd (epoch {}) {}: "
              "starting with the map in etcd", shard, config.shards_size(), committed.epoch(),
              committed.shards_size());
    return out;
  }
  if (!in_file) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", shard, " is not in the config file's ", config.shards_size(),
        " shards, nor in the job's map in etcd (epoch ", committed.epoch(), ", ",
        committed.shards_size(), " shards), nor added by a re-shard under way"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ClusterState>> ClusterState::Join(
    const proto::ClusterConfig& config, ClusterStateOptions options,
    std::shared_ptr<coord::Store> store) {
  if (options.shard >= static_cast<uint32_t>(config.shards_size())) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options.shard, " is not in the map"));
  }
  if (store == nullptr) {
    if (config.coordination().etcd().empty()) {
      return absl::FailedPreconditionError("config coordination.etcd lists no etcd member");
    }
    absl::StatusOr<std::unique_ptr<coord::EtcdStore>> etcd =
        coord::EtcdStore::Create(coord::EtcdStoreOptionsFrom(config.coordination()));
    if (!etcd.ok()) return etcd.status();
    store = *std::move(etcd);
  }
  std::unique_ptr<ClusterState> s(new ClusterState(config, std::move(options), std::move(store)));
  if (absl::Status r = s->Register(); !r.ok()) return r;
  proto::ShardMapRecord first = RecordOf(config, "initial config");
  absl::StatusOr<coord::VersionedMap> m = coord::CreateMapIfAbsent(s->store_.get(), config.job(), first);
  if (!m.ok()) {
    return absl::Status(m.status().code(),
                        absl::StrCat("the job's map in etcd: ", m.status().message()));
  }
  {
    absl::MutexLock l(&s->mu_);
    s->map_ = *m;
  }
  if (absl::Status r = s->Resync(); !r.ok()) return r;
  s->loop_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

ClusterState::~ClusterState() {
  std::optional<coord::Leadership> leading;
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
    leading = leadership_;
  }
  if (loop_.joinable()) loop_.join();
  watch_.reset();
  std::shared_ptr<coord::Election> election;
  std::shared_ptr<coord::LeaseKeeper> lease;
  {
    absl::MutexLock l(&mu_);
    election = std::move(election_);
    lease = std::move(lease_);
  }
  if (leading && election) election->Resign(*leading).IgnoreError();
  election.reset();
  lease.reset();  // revokes: the member record goes now, not at expiry
}

absl::Status ClusterState::Register() {
  std::shared_ptr<coord::LeaseKeeper> old;
  {
    absl::MutexLock l(&mu_);
    old = lease_;
  }
  // A lease this process could not prove alive may still hold the member record in etcd:
  // it goes first, or the record would look held by another process.
  if (old != nullptr) store_->Revoke(old->id()).IgnoreError();
  coord::LeaseKeeperOptions lo;
  lo.ttl = absl::Milliseconds(config_.coordination().lease_ttl_ms());
  // Request time and clock drift both come off what is proven.
  lo.margin = std::min(lo.ttl / 4,
                       absl::Milliseconds(config_.coordination().request_timeout_ms()) +
                           absl::Milliseconds(100));
  absl::StatusOr<std::unique_ptr<coord::LeaseKeeper>> lease =
      coord::LeaseKeeper::Start(store_.get(), lo);
  if (!lease.ok()) {
    return absl::Status(lease.status().code(),
                        absl::StrCat(name_, ": taking a lease in etcd: ", lease.status().message()));
  }
  std::shared_ptr<coord::LeaseKeeper> keeper = *std::move(lease);
  proto::MemberRecord me;
  {
    absl::MutexLock l(&mu_);
    me = member_;
  }
  me.set_address(config_.shards(options_.shard));
  me.set_incarnation(incarnation_);
  if (me.started_unix_ms() == 0) me.set_started_unix_ms(absl::ToUnixMillis(absl::Now()));
  // A process that held this index and died (a restart after SIGKILL, a rescheduled pod)
  // keeps its record until its lease expires: waited out. One that is alive keeps renewing,
  // and this one gives up after a TTL and a second.
  const absl::Time give_up = absl::Now() + lo.ttl + absl::Seconds(1);
  while (true) {
    absl::Status s =
        coord::RegisterMember(store_.get(), config_.job(), options_.shard, me, keeper->id());
    if (s.ok()) break;
    if (!absl::IsAlreadyExists(s) || absl::Now() > give_up) return s;
    absl::SleepFor(absl::Milliseconds(200));
  }
  auto election = std::make_shared<coord::Election>(store_.get(), keys_.coordinator, name_,
                                                    keeper.get());
  absl::MutexLock l(&mu_);
  member_ = me;
  leadership_.reset();
  election_ = std::move(election);
  lease_ = std::move(keeper);
  return absl::OkStatus();
}

absl::StatusOr<coord::RunEntry> ClusterState::EnterRun(
    const std::function<absl::StatusOr<std::string>()>& newest_set) {
  proto::MemberRecord me;
  coord::LeaseId lease = coord::kNoLease;
  {
    absl::MutexLock l(&mu_);
    me = member_;
    if (lease_ != nullptr) lease = lease_->id();
  }
  absl::StatusOr<coord::RunEntry> entry =
      coord::EnterRun(store_.get(), config_.job(), options_.shard, &me, lease, newest_set);
  if (!entry.ok()) return entry.status();
  absl::MutexLock l(&mu_);
  member_ = me;
  return entry;
}

absl::Status ClusterState::MarkServing(uint64_t generation) {
  proto::MemberRecord me;
  coord::LeaseId lease = coord::kNoLease;
  {
    absl::MutexLock l(&mu_);
    if (member_.generation() == generation) return absl::OkStatus();
    member_.set_generation(generation);
    me = member_;
    if (lease_ != nullptr) lease = lease_->id();
  }
  // Only while the record is still this lease's (else a lost lease's return registers it
  // again, with the generation above).
  absl::StatusOr<std::optional<coord::KeyValue>> held = store_->Get(keys_.Member(options_.shard));
  if (!held.ok()) return held.status();
  if (!held->has_value() || (*held)->lease != lease) {
    return absl::FailedPreconditionError("this shard's member record is not held by its lease");
  }
  coord::Txn txn;
  txn.conditions.push_back(
      {keys_.Member(options_.shard), coord::Condition::Field::kModRevision, (*held)->mod_revision});
  txn.puts.push_back({keys_.Member(options_.shard), me.SerializeAsString(), lease});
  absl::StatusOr<coord::TxnResult> r = store_->Commit(txn);
  if (!r.ok()) return r.status();
  if (!r->committed) return absl::AbortedError("this shard's member record changed meanwhile");
  return absl::OkStatus();
}

absl::Status ClusterState::Resync() {
  // The revision first, then the keys, then the watch from that revision: a change in
  // between is both read and replayed, and replaying it again is harmless (members are
  // set, maps only move forward).
  absl::StatusOr<coord::TxnResult> now = store_->Commit(coord::Txn{});
  if (!now.ok()) return now.status();
  absl::StatusOr<std::vector<coord::KeyValue>> kvs = store_->GetPrefix(keys_.prefix);
  if (!kvs.ok()) return kvs.status();
  for (const coord::KeyValue& kv : *kvs) {
    coord::WatchEvent e;
    e.kv = kv;
    OnEvent(e);
  }
  {
    absl::MutexLock l(&mu_);
    // Members whose keys are gone by now: no event will say so.
    std::map<uint32_t, proto::MemberRecord> present;
    for (const coord::KeyValue& kv : *kvs) {
      uint32_t k = 0;
      if (kv.key.rfind(keys_.members, 0) == 0 &&
          absl::SimpleAtoi(kv.key.substr(keys_.members.size()), &k) && members_.count(k)) {
        present[k] = members_[k];
      }
    }
    members_ = std::move(present);
    bool leader_present = false;
    for (const coord::KeyValue& kv : *kvs) leader_present |= kv.key == keys_.coordinator;
    if (!leader_present) leader_.reset();
    watch_broken_ = false;
  }
  watch_.reset();
  absl::StatusOr<std::unique_ptr<coord::Watch>> w = store_->WatchPrefix(
      keys_.prefix, now->revision, [this](const coord::WatchEvent& e) { OnEvent(e); },
      [this](const absl::Status& s) {
        log::Warn("{}: the watch of the cluster's state in etcd broke: {}", name_, s.ToString());
        absl::MutexLock l(&mu_);
        watch_broken_ = true;
      });
  if (!w.ok()) return w.status();
  watch_ = *std::move(w);
  return absl::OkStatus();
}

void ClusterState::OnEvent(const coord::WatchEvent& e) {
  const std::string& key = e.kv.key;
  const bool put = e.type == coord::WatchEvent::Type::kPut;
  if (key == keys_.map) {
    if (!put) return;
    coord::VersionedMap m;
    if (!m.record.ParseFromString(e.kv.value) || !coord::ValidateMap(m.record).ok()) {
      log::Error("{}: the shard map in etcd ({}) does not parse; ignored", name_, key);
      return;
    }
    m.revision = e.kv.mod_revision;
    {
      absl::MutexLock l(&mu_);
      if (m.record.epoch() < map_.record.epoch()) return;
      map_ = m;
    }
    OfferMap(m);
    return;
  }
  if (key == keys_.coordinator) {
    absl::MutexLock l(&mu_);
    uint32_t k = 0;
    // Anyone with access to etcd can write anything there: checked before it is read.
    absl::string_view who = e.kv.value;
    if (put && absl::ConsumePrefix(&who, "shard ") && absl::SimpleAtoi(who, &k)) {
      leader_ = k;
    } else {
      leader_.reset();
    }
    return;
  }
  uint32_t k = 0;
  if (key.rfind(keys_.members, 0) != 0 ||
      !absl::SimpleAtoi(key.substr(keys_.members.size()), &k)) {
    return;
  }
  absl::MutexLock l(&mu_);
  if (put) {
    proto::MemberRecord m;
    if (m.ParseFromString(e.kv.value)) {
      members_[k] = m;
      absent_since_.erase(k);
    }
  } else if (members_.erase(k) > 0) {
    // The lease ended (expired, revoked at a clean stop): down as of now.
    absent_since_[k] = absl::InfinitePast();
  }
}

void ClusterState::OfferMap(const coord::VersionedMap& m) {
  {
    absl::MutexLock l(&mu_);
    if (m.record.epoch() <= offered_epoch_) return;
    offered_epoch_ = m.record.epoch();
  }
  if (options_.on_map) options_.on_map(m.record);
}

absl::Status ClusterState::CheckLease() const {
  absl::MutexLock l(&mu_);
  if (lease_ == nullptr || !lease_->Valid()) {
    return absl::UnavailableError(absl::StrCat(
        name_, " holds no valid lease in etcd (it was paused, or cut off from etcd, for longer "
        "than coordination.lease_ttl_ms): it acknowledges nothing until it has registered "
        "again"));
  }
  if (Lists(map_.record.down_shards(), options_.shard)) {
    return absl::UnavailableError(absl::StrCat(
        name_, " is down in the committed map (epoch ", map_.record.epoch(),
        "): its chunks are served by other shards"));
  }
  return absl::OkStatus();
}

bool ClusterState::IsLive(uint32_t k) const {
  absl::MutexLock l(&mu_);
  if (k == options_.shard) return lease_ != nullptr && lease_->Valid();
  return members_.count(k) > 0;
}

bool ClusterState::Leading() const {
  absl::MutexLock l(&mu_);
  return leadership_.has_value() && lease_ != nullptr && lease_->Valid();
}

std::optional<uint32_t> ClusterState::Leader() const {
  absl::MutexLock l(&mu_);
  return leader_;
}

coord::VersionedMap ClusterState::map() const {
  absl::MutexLock l(&mu_);
  return map_;
}

coord::LeaseId ClusterState::lease() const {
  absl::MutexLock l(&mu_);
  return lease_ == nullptr ? coord::kNoLease : lease_->id();
}

absl::StatusOr<bool> ClusterState::Lead() {
  std::shared_ptr<coord::LeaseKeeper> lease;
  std::shared_ptr<coord::Election> election;
  {
    absl::MutexLock l(&mu_);
    lease = lease_;
    election = election_;
  }
  if (election == nullptr || lease == nullptr || !lease->Valid()) {
    absl::MutexLock l(&mu_);
    leadership_.reset();
    return false;
  }
  absl::StatusOr<std::optional<coord::Leadership>> won = election->TryAcquire();
  absl::MutexLock l(&mu_);
  if (lease_ != lease) return false;  // taken again meanwhile: decide on the next tick
  if (!won.ok()) {
    leadership_.reset();
    return won.status();
  }
  if (won->has_value() && (!leadership_ || leadership_->revision != (*won)->revision)) {
    log::Info("{}: coordinator of job {} (etcd revision {})", name_, config_.job(),
              (*won)->revision);
  }
  leadership_ = *won;
  if (leadership_) leader_ = options_.shard;
  return leadership_.has_value();
}

absl::StatusOr<coord::Leadership> ClusterState::DecidingLeadership() {
  std::optional<coord::Leadership> leading;
  {
    absl::MutexLock l(&mu_);
    if (lease_ == nullptr || !lease_->Valid()) {
      return absl::AbortedError(absl::StrCat(name_, " has no valid lease: it cannot decide"));
    }
    leading = leadership_;
  }
  if (!leading) {
    absl::StatusOr<bool> led = Lead();
    if (!led.ok()) return led.status();
    absl::MutexLock l(&mu_);
    leading = leadership_;
  }
  if (!leading) {
    const std::optional<uint32_t> who = Leader();
    return absl::AbortedError(absl::StrCat(name_, " is not the coordinator",
                                           who ? absl::StrCat(" (shard ", *who, " is)") : ""));
  }
  return *leading;
}

absl::StatusOr<std::optional<coord::VersionedReshard>> ClusterState::ReadReshard() {
  return coord::ReadReshard(store_.get(), config_.job());
}

absl::StatusOr<coord::VersionedReshard> ClusterState::RequestReshard(proto::ReshardRecord request) {
  request.set_requested_by(name_);
  return coord::RequestReshard(store_.get(), config_.job(), std::move(request));
}

absl::StatusOr<coord::VersionedReshard> ClusterState::UpdateReshard(
    const coord::VersionedReshard& base, proto::ReshardRecord next) {
  absl::StatusOr<coord::Leadership> leading = DecidingLeadership();
  if (!leading.ok()) return leading.status();
  next.set_decided_by(name_);
  return coord::UpdateReshard(store_.get(), config_.job(), base, std::move(next), *leading);
}

absl::Status ClusterState::CommitMap(const proto::ClusterConfig& from,
                                     const proto::ClusterConfig& next) {
  absl::StatusOr<coord::Leadership> leading = DecidingLeadership();
  if (!leading.ok()) return leading.status();
  absl::StatusOr<std::optional<coord::VersionedMap>> read = coord::ReadMap(store_.get(), config_.job());
  if (!read.ok()) return read.status();
  if (!read->has_value()) return absl::AbortedError("the job's map record is gone from etcd");
  const coord::VersionedMap& base = **read;
  if (base.record.epoch() > from.shard_map_epoch()) {
    return absl::AbortedError(absl::StrCat("etcd holds map epoch ", base.record.epoch(),
                                           ", newer than this coordinator's ",
                                           from.shard_map_epoch(), ": decided already"));
  }
  proto::ShardMapRecord record = RecordOf(next, name_);
  record.set_written_by_shard(static_cast<int32_t>(options_.shard));
  absl::StatusOr<coord::VersionedMap> written =
      coord::UpdateMap(store_.get(), config_.job(), base, std::move(record), &*leading);
  if (!written.ok()) return written.status();
  absl::MutexLock l(&mu_);
  if (written->record.epoch() > map_.record.epoch()) map_ = *written;
  // The coordinator installs its own decision; the watch need not offer it again.
  offered_epoch_ = std::max(offered_epoch_, written->record.epoch());
  return absl::OkStatus();
}

void ClusterState::Loop() {
  while (true) {
    {
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), tick_);
      if (stop_) return;
    }
    Tick();
  }
}

void ClusterState::Tick() {
  bool lost = false, broken = false;
  {
    absl::MutexLock l(&mu_);
    lost = lease_ == nullptr || lease_->lost();
    broken = watch_broken_;
  }
  if (lost) {
    // Back with a new lease (same shard, same incarnation), unless another process took the
    // index. The map may have moved on meanwhile: on_map and CheckLease see to that.
    absl::Status s = Register();
    if (!s.ok()) {
      static log::LineBudget* const budget = new log::LineBudget(10, "etcd re-registrations");
      if (budget->Admit()) log::Warn("{}: registering again in etcd: {}", name_, s.ToString());
      return;
    }
    log::Warn("{}: lease lost and taken again: registered in etcd anew", name_);
    broken = true;  // read everything again: events may have been missed
  }
  if (broken) {
    if (absl::Status s = Resync(); !s.ok()) return;
  }
  absl::StatusOr<bool> leading = Lead();
  if (!leading.ok() || !*leading) return;
  // The coordinator: every shard of the committed map that is neither down nor this one
  // must hold a lease; one whose lease ended, or that has not registered for two TTLs
  // (a successor coordinator, or a shard that never came back), is failed over.
  const absl::Duration grace = 2 * absl::Milliseconds(config_.coordination().lease_ttl_ms());
  std::vector<std::pair<uint32_t, std::string>> lost_members;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = absl::Now();
    for (uint32_t k = 0; k < static_cast<uint32_t>(map_.record.shards_size()); ++k) {
      if (k == options_.shard || Lists(map_.record.down_shards(), k)) {
        absent_since_.erase(k);
        continue;
      }
      if (members_.count(k)) continue;
      auto [it, fresh] = absent_since_.emplace(k, now);
      if (it->second == absl::InfinitePast()) {
        lost_members.emplace_back(k, "its etcd lease ended");
      } else if (now - it->second >= grace) {
        lost_members.emplace_back(
            k, absl::StrCat("it has held no etcd lease for ", absl::FormatDuration(now - it->second)));
      }
    }
  }
  for (const auto& [k, why] : lost_members) {
    if (options_.on_member_lost) options_.on_member_lost(k, why);
  }
}

}  // namespace gcomp::server
