// ShardService's data path: finding the tensor and owned chunk of a call, PushPull (decode
// on the pool, then the chunk's StepAccumulator) and Pull.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "base/logging.h"
#include "base/utf8.h"
#include "cluster/wire_block.h"
#include "server/shard_service.h"
#include "server/shard_tensor.h"

namespace gcomp::server {
namespace {

// Stats.last_error stays one table cell's worth.
constexpr size_t kMaxLastErrorChars = 200;

}  // namespace

absl::StatusOr<ShardService::Tensor*> ShardService::FindTensor(const std::string& job,
                                                               uint64_t epoch,
                                                               const std::string& key,
                                                               absl::Time deadline) const {
  if (absl::Status s = CheckJobAndEpoch(job, epoch, deadline); !s.ok()) return s;
  absl::Status key_ok = CheckKey(key);
  if (!key_ok.ok()) return key_ok;
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::UnavailableError("shard shutting down");
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown tensor key '", key, "' (not declared)"));
  }
  return it->second.get();
}

absl::StatusOr<std::shared_ptr<StepAccumulator>> ShardService::OwnedChunk(const Tensor& t,
                                                                          uint32_t chunk) const {
  if (absl::Status s = t.CheckChunk(chunk); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = t.chunks.find(chunk);
  if (auto lost = t.lost.find(chunk); lost != t.lost.end()) return absl::DataLossError(lost->second);
  if (it == t.chunks.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        t.OwnedBy(chunk), " under shard-map epoch ", epoch_.load(), ", not shard ", shard(),
        " (where the worker has this epoch too, its config lists the shards otherwise: every "
        "worker and shard must load the same `shards:` list, in the same order)"));
  }
  return it->second;
}

absl::Status ShardService::PushPull(const proto::CompressedBlock& request, absl::Time deadline,
                                    proto::CompressedBlock* response) {
  const absl::string_view data = request.data();
  std::shared_ptr<const proto::CompressedBlock> reply;
  absl::Status s = PushPull(request, cluster::WirePieces(&data, 1), deadline, &reply);
  if (!s.ok()) return s;
  *response = *reply;
  response->mutable_address()->set_worker(request.address().worker());
  // A push checked by XXH64 may come from a worker that reads nothing else.
  if (request.checksum_kind() == proto::CHECKSUM_XXH64) return cluster::UseXxh64(response);
  return absl::OkStatus();
}

absl::Status ShardService::PushPull(const proto::CompressedBlock& request,
                                    cluster::WirePieces data, absl::Time deadline,
                                    std::shared_ptr<const proto::CompressedBlock>* reply) {
  absl::Status status;
  absl::Notification done;
  PushPullAsync(request, data, deadline,
                [&](absl::Status s, std::shared_ptr<const proto::CompressedBlock> r) {
                  status = std::move(s);
                  *reply = std::move(r);
                  done.Notify();
                });
  done.WaitForNotification();
  return status;
}

bool ShardService::MayWaitForMap(uint64_t epoch) const {
  absl::MutexLock lock(&mu_);
  return phase_ != Phase::kServing || epoch > epoch_.load();
}

void ShardService::PushPullAsync(const proto::CompressedBlock& request, cluster::WirePieces data,
                                 absl::Time deadline, PushDone done) {
  // Accounting, then the answer from a pool thread: whoever ends the wait (the step's last
  // pusher, a sweep, a cancel under another lock) only schedules it.
  ReplyDone finish = [this, &request, done = std::move(done)](
                         absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> r) mutable {
    auto answer = std::make_shared<PushDone>(std::move(done));
    auto result = std::make_shared<decltype(r)>(std::move(r));
    pool_->Schedule([this, &request, answer, result] {
      const absl::Status s = result->status();
      CountPushOutcome(request, s);
      std::move (*answer)(s, s.ok() ? **result : nullptr);
    });
  };
  auto run = std::make_shared<std::function<void()>>();
  auto shared_finish = std::make_shared<ReplyDone>(std::move(finish));
  *run = [this, &request, data, deadline, shared_finish] {
    PushPullImpl(request, data, deadline, std::move(*shared_finish));
  };
  if (!MayWaitForMap(request.address().shard_map_epoch())) {
    pool_->Schedule([run] { (*run)(); });
    return;
  }
  {
    absl::MutexLock lock(&map_waits_mu_);
    ++map_waits_;
  }
  std::thread([this, run]() mutable {
    (*run)();
    run.reset();
    absl::MutexLock lock(&map_waits_mu_);
    --map_waits_;
  }).detach();
}

void ShardService::CountPushOutcome(const proto::CompressedBlock& request, const absl::Status& s) {
  metrics_->CountPush(s.code());
  metrics_->SetAdmission(admission_->usage(), admission_->limits().memory_budget_bytes);
  if (!s.ok() && s.code() != absl::StatusCode::kDeadlineExceeded &&
      s.code() != absl::StatusCode::kUnavailable && s.code() != absl::StatusCode::kAborted) {
    ++rejected_pushes_;
    {
      // Statuses name keys, chunks and workers, never the job token (it is checked in
      // the gRPC layer and never reaches here).
      absl::MutexLock lock(&last_error_mu_);
      // Cut at a character boundary: a proto3 string must stay valid UTF-8.
      last_error_ = std::string(Utf8Prefix(s.ToString(), kMaxLastErrorChars));
    }
    // Any client can send rejected pushes at will: a budget of lines keeps the log useful.
    static log::LineBudget* const rejected = new log::LineBudget(10, "rejected pushes");
    if (rejected->Admit()) {
      log::Warn("shard {}: rejected push of chunk {} step {} from worker {}: {}", shard(),
                request.address().chunk(), request.address().step(), request.address().worker(),
                s.ToString());
    }
  }
}

void ShardService::PushPullImpl(const proto::CompressedBlock& request, cluster::WirePieces data,
                                absl::Time deadline, ReplyDone done) {
  absl::Status s = PushPullStart(request, data, deadline, &done);
  if (!s.ok()) std::move(done)(s);
}

absl::Status ShardService::PushPullStart(const proto::CompressedBlock& request,
                                         cluster::WirePieces data, absl::Time deadline,
                                         ReplyDone* done) {
  const proto::BlockAddress& a = request.address();
  absl::StatusOr<Tensor*> found = FindTensor(a.job(), a.shard_map_epoch(), a.key(), deadline);
  if (!found.ok()) return found.status();
  Tensor* t = *found;
  if (absl::Status s = CheckMayAcknowledge(); !s.ok()) return s;
  if (a.worker() >= config_.workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", a.worker(), " out of range: job has ",
                                                   config_.workers(), " workers"));
  }
  if (absl::Status s = CheckSession(a.worker(), a.session()); !s.ok()) return s;
  if (a.step() < 0 || a.step() >= kMaxStep) {
    return absl::InvalidArgumentError(absl::StrCat("step ", a.step(), " out of range [0, 2^62)"));
  }
  if (absl::Status frozen = WaitWhileFrozen(a.shard_map_epoch(), a.step(), deadline); !frozen.ok()) {
    return frozen;
  }
  absl::StatusOr<std::shared_ptr<StepAccumulator>> owned = OwnedChunk(*t, a.chunk());
  if (!owned.ok()) return owned.status();
  StepAccumulator* acc = owned->get();
  const size_t n = t->layout.size(a.chunk());
  if (request.dtype() != cluster::ToProto(t->dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block dtype ", cluster::WireDTypeName(request.dtype()), " does not match '",
                     a.key(), "' (", codec::DTypeName(t->dtype), ")"));
  }
  if (request.elements() != n) {
    // Workers and shards split a tensor by the same chunk_bytes; a worker started with
    // another value (its own --set or config file) is the usual cause.
    return absl::InvalidArgumentError(
        absl::StrCat("block holds ", request.elements(), " elements; chunk ", a.chunk(), " of '",
                     a.key(), "' has ", n, " (this shard's chunk_bytes is ", config_.chunk_bytes(),
                     ": does the worker's config set the same?)"));
  }
  size_t data_size = 0;
  for (absl::string_view piece : data) data_size += piece.size();
  if (data_size > cluster::MaxWireBytes(n, t->dtype)) {
    return absl::ResourceExhaustedError(absl::StrCat("block of ", data_size,
                                                     " bytes exceeds the bound ",
                                                     cluster::MaxWireBytes(n, t->dtype), " for ", n,
                                                     " elements"));
  }
  absl::StatusOr<bool> duplicate = acc->Admit(a.worker(), a.step());
  if (!duplicate.ok()) return duplicate.status();
  std::vector<float> contribution;
  if (!*duplicate) {
    absl::StatusOr<std::vector<float>> buffer = acc->TakeBuffer();
    if (!buffer.ok()) return buffer.status();
    contribution = *std::move(buffer);
    // On a pool thread already. A GComp payload that arrived in pieces is joined here
    // first; kept per thread, so the copy costs no allocation once warm.
    thread_local std::string scratch;
    const absl::Time start = absl::Now();
    absl::Status decoded;
    if (t->dtype == codec::DType::kF32) {
      decoded = cluster::DecodeWireBlock(request, data, t->dtype, n, contribution.data(), &scratch);
    } else {
      std::vector<uint16_t> narrow(n);
      decoded = cluster::DecodeWireBlock(request, data, t->dtype, n, narrow.data(), &scratch);
      if (decoded.ok()) codec::ToF32(t->dtype, narrow.data(), n, contribution.data());
    }
    const absl::Duration decode_time = absl::Now() - start;
    metrics_->ObserveDecode(n * codec::DTypeBytes(t->dtype), absl::ToDoubleSeconds(decode_time));
    if (!decoded.ok()) {
      acc->GiveBack(std::move(contribution));
      return decoded;
    }
  }
  ++pushes_;
  bytes_in_ += data_size;
  raw_bytes_in_ += n * codec::DTypeBytes(t->dtype);
  metrics_->AddIn(n * codec::DTypeBytes(t->dtype), data_size);
  // A push waiting for the other workers ends when another process registers with its
  // worker index: of two processes run with one index, the first learns it while it waits.
  const uint32_t worker = a.worker();
  const uint64_t session = a.session();
  StepAccumulator::CallCheck check;
  if (session != 0) check = [this, worker, session] { return CheckSession(worker, session); };
  const size_t raw = n * codec::DTypeBytes(t->dtype);
  StepAccumulator::Blocking blocking;
  if (replication_pool_ != nullptr) {
    blocking = [this, keep = *owned](StepAccumulator::Work work) {
      auto task = std::make_shared<StepAccumulator::Work>(std::move(work));
      replication_pool_->Schedule([keep, task] { std::move(*task)(); });
    };
  }
  acc->PushAsync(
      worker, a.step(), std::move(contribution), deadline, std::move(check),
      [this, raw, done = std::move(*done)](
          absl::StatusOr<StepAccumulator::Outcome> outcome) mutable {
        if (!outcome.ok()) return std::move(done)(outcome.status());
        if (outcome->duplicate) {
          ++duplicate_pushes_;
          metrics_->CountDuplicate();
        }
        // The step may have waited long: a shard fenced meanwhile answers nothing (its
        // chunks may already be served elsewhere; the result waits in the backups,
        // replicated first).
        if (absl::Status s = CheckMayAcknowledge(); !s.ok()) return std::move(done)(s);
        bytes_out_ += outcome->reply->data().size();
        metrics_->AddOut(raw, outcome->reply->data().size());
        raw_bytes_out_ += raw;
        std::move(done)(std::move(outcome->reply));
      },
      std::move(blocking));
  return absl::OkStatus();
}

absl::Status ShardService::Pull(const proto::PullRequest& r, proto::CompressedBlock* response,
                                absl::Time deadline) {
  absl::StatusOr<Tensor*> found = FindTensor(r.job(), r.shard_map_epoch(), r.key(), deadline);
  if (!found.ok()) return found.status();
  Tensor* t = *found;
  if (absl::Status s = CheckMayAcknowledge(); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<StepAccumulator>> owned = OwnedChunk(*t, r.chunk());
  if (!owned.ok()) return owned.status();
  absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> current = (*owned)->Current();
  if (!current.ok()) return current.status();
  *response = **current;
  if (std::find(r.checksums_read().begin(), r.checksums_read().end(),
                response->checksum_kind()) == r.checksums_read().end()) {
    if (absl::Status s = cluster::UseXxh64(response); !s.ok()) return s;
  }
  bytes_out_ += response->data().size();
  metrics_->AddOut(response->elements() * codec::DTypeBytes(t->dtype), response->data().size());
  raw_bytes_out_ += t->layout.size(r.chunk()) * codec::DTypeBytes(t->dtype);
  return absl::OkStatus();
}

}  // namespace gcomp::server
