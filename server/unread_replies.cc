#include "server/unread_replies.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "cluster/grpc_status.h"
#include "grpc/grpc.h"
#include "grpcpp/server_context.h"

namespace gcomp::server {
namespace {

log::LineBudget* CancellationLines() {
  static log::LineBudget* const budget = new log::LineBudget(10, "unread-reply cancellations");
  return budget;
}

}  // namespace

UnreadReplies::~UnreadReplies() {
  stop_.Notify();
  if (watchdog_.joinable()) watchdog_.join();
}

void UnreadReplies::StartWatchdog() {
  watchdog_ = std::thread([this] {
    while (!stop_.WaitForNotificationWithTimeout(options_.sweep_every)) Sweep();
  });
}

void UnreadReplies::TakeForCancel(Entry* entry, std::vector<std::shared_ptr<Reply>>* out) {
  entry->cancelled = true;
  out->push_back(entry->reply);
  ++cancelled_;
}

uint64_t UnreadReplies::Begin(absl::string_view peer, std::shared_ptr<Reply> reply) {
  std::string address = AddressOfPeer(peer);
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  Entry& e = entries_[id];
  e.address = std::move(address);
  e.begun = absl::Now();
  e.reply = std::move(reply);
  return id;
}

void UnreadReplies::End(uint64_t id) {
  std::shared_ptr<Reply> last;  // released outside the lock
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  last = std::move(it->second.reply);
  entries_.erase(it);
}

absl::Status UnreadReplies::Admit(absl::string_view peer, absl::Time now) {
  const std::string address = AddressOfPeer(peer);
  absl::MutexLock lock(&mu_);
  const absl::Duration left = refusals_.RefusedFor(address, now);
  if (left <= absl::ZeroDuration()) return absl::OkStatus();
  return cluster::BusyRefusal(absl::StrCat(
      "client address ", log::Clip(address, 64), " left replies unread on this shard (more than ",
      options_.max_per_address, " for ", absl::FormatDuration(options_.min_age), ", or one for ",
      absl::FormatDuration(options_.timeout), "): its calls are refused for another ",
      absl::FormatDuration(absl::Ceil(left, absl::Milliseconds(1))), " (replies unread)"));
}

size_t UnreadReplies::Sweep(absl::Time now) {
  std::vector<std::shared_ptr<Reply>> cancel;
  std::string crowded, overdue;  // an address of each kind, for the log
  {
    absl::MutexLock lock(&mu_);
    // Per address: replies not ended (cancelled ones too), and the oldest not cancelled.
    absl::flat_hash_map<std::string, uint32_t> unread_at;
    absl::flat_hash_map<std::string, absl::Time> oldest;
    size_t unread = 0;
    for (const auto& [id, e] : entries_) {
      ++unread_at[e.address];
      if (e.cancelled) continue;
      ++unread;
      auto [it, added] = oldest.try_emplace(e.address, e.begun);
      if (!added) it->second = std::min(it->second, e.begun);
    }
    // Several addresses each under the bound can still hold the threads together: past the
    // bound in all, every reply unread for min_age goes (honest ones are read by then).
    const bool crowded_in_all = unread > options_.max_per_address;
    for (auto& [id, e] : entries_) {
      if (e.cancelled) continue;
      const bool too_many = (unread_at[e.address] > options_.max_per_address &&
                             now - oldest[e.address] >= options_.min_age) ||
                            (crowded_in_all && now - e.begun >= options_.min_age);
      const bool too_old = now - e.begun >= options_.timeout;
      if (!too_many && !too_old) continue;
      TakeForCancel(&e, &cancel);
      refusals_.Refuse(e.address, now);
      (too_many ? crowded : overdue) = e.address;
    }
    refusals_.Forget(now);
  }
  const size_t n = cancel.size();
  if (n != 0 && CancellationLines()->Admit()) {
    log::Warn(
        "{} replies cancelled, unread: {}{}{}; their addresses' calls are refused for a "
        "while (a client that does not read its replies, or one far behind)",
        n,
        crowded.empty() ? ""
                        : absl::StrCat("more than ", options_.max_per_address, " for ",
                                       absl::FormatDuration(options_.min_age),
                                       " from one address or from all, ", log::Clip(crowded, 64),
                                       " among them"),
        !crowded.empty() && !overdue.empty() ? ", and " : "",
        overdue.empty() ? ""
                        : absl::StrCat("one for ", absl::FormatDuration(options_.timeout), " from ",
                                       log::Clip(overdue, 64)));
  }
  // Cancelling may end a call on this thread (its End takes mu_).
  for (const std::shared_ptr<Reply>& r : cancel) r->Cancel();
  if (n != 0 && options_.on_cancelled) options_.on_cancelled(n);
  return n;
}

uint64_t UnreadReplies::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

size_t UnreadReplies::unread() const {
  absl::MutexLock lock(&mu_);
  return entries_.size();
}

namespace {

using grpc::experimental::InterceptionHookPoints;

// Holds a reference on the call, so that a cancellation racing with the call's end is safe.
class CallReply final : public UnreadReplies::Reply {
 public:
  explicit CallReply(grpc_call* call) : call_(call) { grpc_call_ref(call_); }
  ~CallReply() override { grpc_call_unref(call_); }
  void Cancel() override {
    grpc_call_cancel_with_status(call_, GRPC_STATUS_CANCELLED,
                                 "the reply was not read in time (gcomp-ps shard)", nullptr);
  }

 private:
  grpc_call* const call_;
};

class UnreadRepliesInterceptor final : public grpc::experimental::Interceptor {
 public:
  UnreadRepliesInterceptor(std::shared_ptr<UnreadReplies> replies,
                           grpc::experimental::ServerRpcInfo* info)
      : replies_(std::move(replies)), info_(info) {}
  ~UnreadRepliesInterceptor() override {
    if (const uint64_t id = id_.load(std::memory_order_acquire); id != 0) replies_->End(id);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // The send hooks run on the thread that answers, the others may run on gRPC's own
    // threads: only the send hooks set id_, atomic for the destructor, which may run on
    // either.
    const bool sending =
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA) ||
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_MESSAGE) ||
        methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS);
    if (sending && id_.load(std::memory_order_acquire) == 0) {
      grpc::ServerContextBase* context = info_->server_context();
      if (context != nullptr && context->c_call() != nullptr) {
        id_.store(replies_->Begin(context->peer(), std::make_shared<CallReply>(context->c_call())),
                  std::memory_order_release);
      }
    }
    methods->Proceed();
  }

 private:
  const std::shared_ptr<UnreadReplies> replies_;
  grpc::experimental::ServerRpcInfo* const info_;
  std::atomic<uint64_t> id_{0};
};

}  // namespace

grpc::experimental::Interceptor* UnreadRepliesInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  if (info->type() != grpc::experimental::ServerRpcInfo::Type::UNARY) return nullptr;
  return new UnreadRepliesInterceptor(replies_, info);
}

}  // namespace gcomp::server
