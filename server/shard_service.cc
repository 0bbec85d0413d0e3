// ShardService's core: construction, the checks every call passes (job, shard-map epoch,
// key), worker registration, stats and shutdown. The other parts of the class live in
// shard_declare.cc, shard_push.cc, shard_checkpoint.cc, shard_reshard.cc and
// shard_replication.cc.
#include "server/shard_service.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/system_memory.h"
#include "cluster/direction_codec.h"
#include "cluster/grpc_status.h"
#include "server/shard_tensor.h"

namespace gcomp::server {
namespace {

// A call under a map that a failover is still installing here (clients retry Unavailable).
absl::Status NotInstalledError(uint64_t epoch) {
  return absl::UnavailableError(
      absl::StrCat("shard-map epoch ", epoch, " is not installed on this shard yet; retry"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ShardService>> ShardService::Create(
    const proto::ClusterConfig& config, const ShardOptions& options) {
  absl::Status s = cluster::ValidateClusterConfig(config);
  if (!s.ok()) return s;
  if (options.shard >= static_cast<uint32_t>(config.shards_size())) {
    return absl::InvalidArgumentError(absl::StrCat("shard ", options.shard, " out of range: the config lists ",
                                                   config.shards_size(), " shards"));
  }
  if (options.decode_threads < 1 || options.decode_threads > kMaxDecodeThreads) {
    return absl::InvalidArgumentError(absl::StrCat(
        "decode_threads must be 1 to ", kMaxDecodeThreads, ", got ", options.decode_threads));
  }
  std::unique_ptr<ShardService> service(new ShardService(config, options));
  {
    ShardService* raw = service.get();
    service->expiry_thread_ = std::thread([raw] { raw->ExpiryLoop(); });
  }
  s = service->EnterJob();
  if (!s.ok()) return s;
  if (!config.checkpoint().dir().empty()) {
    if (config.checkpoint().every_steps() > 0) {
      ShardService* raw = service.get();
      service->ckpt_thread_ = std::thread([raw] { raw->CheckpointLoop(); });
    }
  }
  return service;
}

uint64_t ShardService::MemoryBudgetBytes(const proto::LimitsConfig& limits) {
  if (limits.memory_budget_bytes() != 0) return limits.memory_budget_bytes();
  return AvailableMemoryBytes() / 10 * 8;
}

ShardService::ShardService(proto::ClusterConfig config, const ShardOptions& options)
    : config_(std::move(config)),
      options_(options),
      checkpoint_dir_(cluster::JobCheckpointDir(config_)),
      self_address_(config_.shards(options.shard)),
      downlink_(cluster::DownlinkCodec(config_)),
      pool_(std::make_unique<ThreadPool>(options.decode_threads)),
      admission_(std::make_unique<Admission>(
          AdmissionLimits{MemoryBudgetBytes(config_.limits()), config_.limits().max_pending_steps(),
                          config_.limits().max_pending_bytes()})),
      metrics_(std::make_unique<ShardMetrics>(config_.job(), options.shard)),
      map_config_(config_),
      shard_map_(config_.shards_size(), config_.shard_map_epoch()),
      epoch_(config_.shard_map_epoch()),
      shard_index_(options.shard),
      map_shards_(config_.shards_size()),
      replicas_(cluster::Replicas(config_)),
      down_(config_.shards_size(), false),
      joining_shards_(config_.shards_size(), false),
      worker_names_(config_.workers()),
      worker_sessions_(new std::atomic<uint64_t>[config_.workers()]()) {
  for (uint32_t k : config_.down_shards()) down_[k] = true;
  for (uint32_t k : config_.joining_shards()) joining_shards_[k] = true;
  for (uint32_t w = 0; w < config_.workers(); ++w) worker_names_[w] = absl::StrCat("worker-", w);
  if (replicas_ > 1) replication_pool_ = std::make_unique<ThreadPool>(kReplicationThreads);
  metrics_->SetTensors(0, 0, config_.shard_map_epoch());
  metrics_->SetCheckpointInterval(config_.checkpoint().dir().empty() ? 0 : config_.checkpoint().every_steps());
  metrics_->SetAdmission(admission_->usage(), admission_->limits().memory_budget_bytes);
  log::Info("shard {}: memory budget {} bytes{}, at most {} tensors, {} pending steps", shard(),
            admission_->limits().memory_budget_bytes,
            config_.limits().memory_budget_bytes() == 0 ? " (80% of the memory available)" : "",
            config_.limits().max_tensors(), config_.limits().max_pending_steps());
}

ShardService::~ShardService() {
  Shutdown();
  if (switch_thread_.joinable()) switch_thread_.join();
  {
    absl::MutexLock lock(&rejoin_thread_mu_);
    if (rejoin_thread_.joinable()) rejoin_thread_.join();
  }
  {
    absl::MutexLock lock(&ckpt_mu_);
    ckpt_stop_ = true;
  }
  if (ckpt_thread_.joinable()) ckpt_thread_.join();
  {
    absl::MutexLock lock(&expiry_mu_);
    expiry_stop_ = true;
  }
  if (expiry_thread_.joinable()) expiry_thread_.join();
  {
    absl::MutexLock lock(&map_waits_mu_);
    map_waits_mu_.Await(absl::Condition(
        +[](int* n) { return *n == 0; }, &map_waits_));
  }
  replication_pool_.reset();  // runs what is queued: the shard is shutting down, so it ends fast
  // Accumulators answer their waits as they go; those answers run on the pool.
  {
    absl::MutexLock lock(&mu_);
    tensors_.clear();
  }
  pool_.reset();
}

void ShardService::ExpiryLoop() {
  // Waiting pushes hold no thread: their deadlines, step timeouts and call checks are
  // looked at here, every 10 ms (a call past its deadline still holds its limiter slots,
  // and its client may retry at once).
  for (int tick = 0;; ++tick) {
    {
      absl::MutexLock lock(&expiry_mu_);
      if (expiry_mu_.AwaitWithTimeout(absl::Condition(&expiry_stop_), absl::Milliseconds(10))) {
        return;
      }
    }
    for (const std::shared_ptr<StepAccumulator>& acc : Accumulators()) {
      if (acc->has_waiters()) acc->Sweep();
    }
    const uint64_t limit = admission_->limits().max_pending_steps;
    if (tick % 100 == 0 && 2 * admission_->usage().pending_steps >= limit) ExpireTimedOutSteps();
  }
}

std::vector<std::shared_ptr<StepAccumulator>> ShardService::Accumulators() const {
  std::vector<std::shared_ptr<StepAccumulator>> all;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [key, t] : tensors_) {
    for (const auto& [chunk, acc] : t->chunks) all.push_back(acc);
  }
  return all;
}

void ShardService::DropPendingPushesOf(uint32_t worker) {
  const std::vector<std::shared_ptr<StepAccumulator>> all = Accumulators();
  // UNAVAILABLE: the clients push again by themselves, and the step then takes the new
  // process's gradient (before, the replaced process's push stayed and the new one's was
  // taken for its retry, until the step timed out).
  const absl::Status dropped = absl::UnavailableError(absl::StrCat(
      "a new process registered as worker ", worker, " ('", log::Clip(WorkerName(worker), 48),
      "'), so the push of the process it replaced was dropped from this step: push it again"));
  uint64_t steps = 0;
  for (const std::shared_ptr<StepAccumulator>& acc : all)
    steps += acc->DropPendingOf(worker, dropped);
  if (steps > 0) {
    log::Info(
        "shard {}: worker {} re-registered from a new process: its pushes to {} pending "
        "steps dropped, those steps start again",
        shard(), worker, steps);
  }
}

void ShardService::ExpireTimedOutSteps() {
  const std::vector<std::shared_ptr<StepAccumulator>> all = Accumulators();
  const uint64_t before = admission_->usage().pending_steps;
  for (const std::shared_ptr<StepAccumulator>& acc : all) acc->ExpireIfDue();
  const uint64_t after = admission_->usage().pending_steps;
  if (after < before) {
    log::Info(
        "{} timed-out steps with nobody waiting failed, freeing their pending-step slots "
        "(limits.max_pending_steps = {})",
        before - after, admission_->limits().max_pending_steps);
  }
}

std::string ShardService::WorkerName(uint32_t worker) const {
  absl::MutexLock lock(&names_mu_);
  return worker < worker_names_.size() ? worker_names_[worker] : absl::StrCat("worker-", worker);
}

absl::Status ShardService::RegisterWorker(const proto::RegisterWorkerRequest& r,
                                          proto::RegisterWorkerResponse* response,
                                          absl::Time deadline) {
  if (absl::Status s = CheckJobAndEpoch(r.job(), r.shard_map_epoch(), deadline); !s.ok()) return s;
  if (absl::Status s = CheckWorkerConfig(r); !s.ok()) return s;
  if (r.worker() >= config_.workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", r.worker(), " out of range: job has ",
                                                   config_.workers(), " workers"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shard shutting down");
  }
  if (r.name().size() > config_.limits().max_key_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("worker name of ", r.name().size(),
                                                   " bytes exceeds limits.max_key_bytes = ",
                                                   config_.limits().max_key_bytes()));
  }
  uint64_t replaced = 0;
  {
    absl::MutexLock lock(&names_mu_);
    if (!r.name().empty()) worker_names_[r.worker()] = r.name();
    // The latest registration wins: a restarted worker takes its index over from the
    // process that died, and a second live process with the index shows at the first one's
    // next push.
    if (r.session() != 0) replaced = worker_sessions_[r.worker()].exchange(r.session());
  }
  if (replaced != 0 && replaced != r.session()) DropPendingPushesOf(r.worker());
  static log::LineBudget* const registrations = new log::LineBudget(20, "registrations");
  if (registrations->Admit()) {
    log::Info("shard {}: worker {} registered as '{}'", shard(), r.worker(), log::Clip(r.name()));
  }
  response->set_shard(shard());
  response->set_workers(config_.workers());
  response->add_checksums_read(cluster::kFastChecksum);
  return absl::OkStatus();
}

absl::Status ShardService::CheckWorkerConfig(const proto::RegisterWorkerRequest& r) const {
  std::vector<std::string> differ;
  if (r.has_uplink()) {
    const std::string theirs = cluster::DescribeCodec(r.uplink());
    const std::string ours = cluster::DescribeCodec(config_.uplink());
    if (theirs != ours) differ.push_back(absl::StrCat("uplink ", theirs, " against ", ours));
  }
  if (r.chunk_bytes() != 0 && r.chunk_bytes() != config_.chunk_bytes()) {
    differ.push_back(
        absl::StrCat("chunk_bytes ", r.chunk_bytes(), " against ", config_.chunk_bytes()));
  }
  if (r.workers() != 0 && r.workers() != config_.workers()) {
    differ.push_back(absl::StrCat("workers ", r.workers(), " against ", config_.workers()));
  }
  if (differ.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "worker ", r.worker(), "'s cluster config disagrees with shard ", shard(),
      "'s: ", absl::StrJoin(differ, "; "),
      " (the worker's first). Every worker and shard must load the same config; one edited "
      "while pods start reaches them at different moments, and running shards keep the "
      "settings they started with"));
}

absl::Status ShardService::CheckSession(uint32_t worker, uint64_t session) const {
  // Callers refuse a worker out of range; the bound here only keeps the read inside.
  if (session == 0 || worker >= config_.workers()) return absl::OkStatus();
  const uint64_t registered = worker_sessions_[worker].load();
  if (registered == 0 || registered == session) return absl::OkStatus();
  return absl::AlreadyExistsError(absl::StrCat(
      "another process registered as worker ", worker, " ('", WorkerName(worker),
      "') after this one: two processes run with worker index ", worker,
      " (each worker of the job needs its own index), or this one is an earlier instance "
      "that should have stopped"));
}

absl::Status ShardService::CheckKey(const std::string& key) const {
  if (key.empty()) return absl::InvalidArgumentError("tensor key must not be empty");
  if (key.size() > config_.limits().max_key_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor key of ", key.size(),
                                                   " bytes exceeds limits.max_key_bytes = ",
                                                   config_.limits().max_key_bytes()));
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckJob(const std::string& job, bool name_ours) const {
  if (job == config_.job()) return absl::OkStatus();
  return absl::NotFoundError(
      absl::StrCat("unknown job '", job, "'",
                   name_ours ? absl::StrCat(" (shard serves job '", config_.job(), "')") : ""));
}

void ShardService::SetPhaseLocked(Phase phase) const {
  phase_ = phase;
  metrics_->SetReshardInProgress(phase == Phase::kPrepared || phase == Phase::kCommitted ||
                                 phase == Phase::kFilling);
}

absl::Status ShardService::Ready() const {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::UnavailableError("shutting down");
    if (rejoining_) return absl::UnavailableError("rejoining the running job");
    if (phase_ == Phase::kDrained) {
      return absl::UnavailableError("drained: not in the shard map any more");
    }
  }
  return CheckMayAcknowledge();
}

absl::Status ShardService::CheckJobAndEpoch(const std::string& job, uint64_t epoch,
                                            absl::Time deadline) const {
  if (absl::Status s = CheckJob(job, /*name_ours=*/true); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return CheckEpochLocked(epoch, deadline);
}

std::string ShardService::SupersededMessage(uint64_t epoch) const {
  const proto::ClusterConfig& now = phase_ == Phase::kCommitted ? next_config_ : map_config_;
  return absl::StrCat("shard-map epoch ", epoch, " was replaced by epoch ", now.shard_map_epoch(),
                      " (", now.shards_size(), " shards)",
                      switch_step_ >= 0 ? absl::StrCat(" from step ", switch_step_) : "",
                      "; fetch the new config from any shard and resend");
}

absl::Status ShardService::CheckEpochLocked(uint64_t epoch, absl::Time deadline) const {
  ExpirePrepareLocked();
  if (rejoining_ && std::this_thread::get_id() != restoring_thread_) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", self_address_, " restarted and is rejoining the running job; retry"));
  }
  if (replicas_ > 1 && epoch > epoch_.load() && phase_ == Phase::kServing) {
    // A failover's map reaches the shards one after the other: a caller that learnt it
    // from another shard waits a little for it here.
    auto installed = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return shutting_down_ || epoch_.load() >= epoch || phase_ != Phase::kServing;
    };
    if (absl::Status s =
            AwaitEpochLocked(installed, std::min(deadline, absl::Now() + absl::Seconds(2)), epoch);
        !s.ok()) {
      return s;
    }
    if (epoch_.load() < epoch && !shutting_down_ && phase_ == Phase::kServing) {
      return NotInstalledError(epoch);
    }
  }
  const uint64_t current = epoch_.load();
  const bool switching = (phase_ == Phase::kPrepared || phase_ == Phase::kCommitted) &&
                         epoch == next_config_.shard_map_epoch();
  if (epoch == current && phase_ == Phase::kDrained) {
    return absl::FailedPreconditionError(
        absl::StrCat("this shard (", self_address_, ") is not in shard-map epoch ", epoch,
                     "; a re-shard removed it, or a failover took it out of the map as down"));
  }
  if (epoch == current && phase_ != Phase::kFilling && !joining_) return absl::OkStatus();
  if (epoch != current && !switching) {
    // With replicas, every older epoch was replaced by a failover or rejoin (a restarted
    // shard knows only the maps since it came back): the caller fetches the newer one.
    if (epoch != 0 && (epoch <= left_epoch_ || (replicas_ > 1 && epoch < current))) {
      return absl::AbortedError(SupersededMessage(epoch));
    }
    return absl::FailedPreconditionError(absl::StrCat("shard-map epoch ", epoch,
                                                      " does not match the shard's epoch ", current));
  }
  // A call of the new map before this shard serves it: wait for the switch and the moved
  // state.
  auto ready = [this, epoch]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ExpirePrepareLocked();
    if (shutting_down_) return true;
    if (epoch_.load() == epoch) return phase_ != Phase::kFilling && !joining_;
    return phase_ == Phase::kServing;  // the re-shard was dropped
  };
  if (absl::Status s = AwaitEpochLocked(ready, deadline, epoch); !s.ok()) return s;
  if (shutting_down_) return absl::UnavailableError("shard shutting down");
  if (epoch_.load() != epoch) {
    if (phase_ == Phase::kServing) {
      return absl::FailedPreconditionError(absl::StrCat("shard-map epoch ", epoch,
                                                        " does not match the shard's epoch ",
                                                        epoch_.load(), " (the re-shard was dropped)"));
    }
    return absl::UnavailableError(absl::StrCat("shard is switching to shard-map epoch ", epoch,
                                               "; retry"));
  }
  if (phase_ == Phase::kFilling || joining_) {
    return absl::UnavailableError(absl::StrCat("shard is receiving moved chunks for shard-map epoch ",
                                               epoch, "; retry"));
  }
  return absl::OkStatus();
}

absl::Status ShardService::CheckPeerEpochLocked(uint64_t epoch) const {
  if (epoch < epoch_.load()) return absl::AbortedError(SupersededMessage(epoch));
  if (epoch > epoch_.load()) return NotInstalledError(epoch);
  return absl::OkStatus();
}

bool ShardService::AwaitLocked(const std::function<bool()>& ready, absl::Time deadline) const {
  // A prepared re-shard expires without any call touching mu_, so waits wake at its
  // deadline to notice.
  while (!ready()) {
    const absl::Time until =
        phase_ == Phase::kPrepared ? std::min(deadline, prepare_deadline_) : deadline;
    auto cond = [&ready]() { return ready(); };
    if (mu_.AwaitWithDeadline(absl::Condition(&cond), until)) return true;
    if (absl::Now() >= deadline) return ready();
  }
  return true;
}

absl::Status ShardService::AwaitEpochLocked(const std::function<bool()>& ready, absl::Time deadline,
                                            uint64_t epoch, EpochWaiter who) const {
  if (ready()) return absl::OkStatus();
  const bool transfer = who == EpochWaiter::kTransfer;
  uint32_t& waiting = waiting_for_epoch_[transfer ? 1 : 0];
  const uint32_t most = std::max<uint32_t>(
      1, transfer ? options_.max_waiting_for_epoch / 2 : options_.max_waiting_for_epoch);
  if (waiting >= most) {
    // Busy, not full: clients and peers retry after a backoff.
    return cluster::BusyRefusal(
        absl::StrCat(waiting, transfer ? " transfer calls" : " calls",
                     " in flight on this shard wait for shard-map epoch ", epoch, " (at most ",
                     most, "); retry"));
  }
  ++waiting;
  AwaitLocked(ready, deadline);
  --waiting;
  return absl::OkStatus();
}

void ShardService::Stats(proto::StatsResponse* r) const {
  r->set_shard(shard());
  r->set_pushes(pushes_);
  r->set_duplicate_pushes(duplicate_pushes_);
  r->set_rejected_pushes(rejected_pushes_);
  r->set_bytes_in(bytes_in_);
  r->set_bytes_out(bytes_out_);
  r->set_raw_bytes_in(raw_bytes_in_);
  r->set_raw_bytes_out(raw_bytes_out_);
  r->set_shard_map_epoch(epoch_.load());
  r->set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - started_));
  {
    absl::MutexLock lock(&last_error_mu_);
    r->set_last_error(last_error_);
  }
  absl::MutexLock lock(&mu_);
  uint64_t chunks_owned = 0;
  for (const auto& [key, t] : tensors_) chunks_owned += t->chunks.size();
  r->set_chunks_owned(chunks_owned);
  r->set_steps_completed(steps_completed_.load());
  r->set_steps_failed(steps_failed_.load());
  r->set_tensors(tensors_.size());
  *r->mutable_down_shards() = map_config_.down_shards();
  r->set_replication_degraded(map_config_.down_shards_size() > 0);
  const AdmissionUsage usage = admission_->usage();
  r->set_memory_budget_bytes(admission_->limits().memory_budget_bytes);
  r->set_memory_used_bytes(usage.memory_bytes);
  r->set_pending_steps(usage.pending_steps);
  r->set_pending_bytes(usage.pending_bytes);
  r->set_refused_by_limits(usage.refused);
}

void ShardService::Shutdown() {
  std::vector<std::shared_ptr<StepAccumulator>> chunks;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return;
    shutting_down_ = true;
    for (const auto& [key, t] : tensors_) {
      for (const auto& [c, acc] : t->chunks) chunks.push_back(acc);
    }
  }
  // Outside mu_: accumulators take their own locks.
  for (const auto& acc : chunks) acc->Cancel(absl::UnavailableError("shard shutting down"));
}
proto::ClusterConfig ShardService::CurrentConfig() const {
  absl::MutexLock lock(&mu_);
  return phase_ == Phase::kCommitted ? next_config_ : map_config_;
}

}  // namespace gcomp::server
