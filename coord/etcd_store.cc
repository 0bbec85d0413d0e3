#include "coord/etcd_store.h"

#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace gcomp::coord {
namespace {

absl::Status FromGrpc(const grpc::Status& s, absl::string_view endpoint, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  // gRPC's codes are absl's, number for number.
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("etcd at ", endpoint, ": ", what, ": ", s.error_message()));
}

bool MemberDown(const absl::Status& s) {
  return absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s);
}

KeyValue FromProto(const mvccpb::KeyValue& kv) {
  KeyValue out;
  out.key = kv.key();
  out.value = kv.value();
  out.create_revision = kv.create_revision();
  out.mod_revision = kv.mod_revision();
  out.lease = kv.lease();
  return out;
}

absl::Status CheckEndpoint(const std::string& e) {
  const size_t colon = e.rfind(':');
  uint32_t port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(absl::string_view(e).substr(colon + 1), &port) || port == 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd endpoint '", e, "' is not host:port (e.g. 127.0.0.1:2379)"));
  }
  return absl::OkStatus();
}

}  // namespace

EtcdStoreOptions EtcdStoreOptionsFrom(const proto::CoordinationConfig& coordination) {
  EtcdStoreOptions o;
  o.endpoints.assign(coordination.etcd().begin(), coordination.etcd().end());
  o.request_timeout = absl::Milliseconds(coordination.request_timeout_ms());
  return o;
}

std::string PrefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char& last = reinterpret_cast<unsigned char&>(end.back());
    if (last < 0xff) {
      ++last;
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // etcd: every key
}

struct EtcdStore::Member {
  std::string endpoint;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<etcdserverpb::KV::Stub> kv;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch;
};

absl::StatusOr<std::unique_ptr<EtcdStore>> EtcdStore::Create(const EtcdStoreOptions& options) {
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("no etcd endpoint given");
  }
  for (const std::string& e : options.endpoints) {
    if (absl::Status s = CheckEndpoint(e); !s.ok()) return s;
  }
  if (options.request_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("etcd request timeout must be positive");
  }
  return std::unique_ptr<EtcdStore>(new EtcdStore(options));
}

EtcdStore::EtcdStore(const EtcdStoreOptions& options) : options_(options) {
  for (const std::string& e : options_.endpoints) {
    auto m = std::make_unique<Member>();
    m->endpoint = e;
    grpc::ChannelArguments args;
    // Fail fast on a dead member (the call moves to the next) rather than wait out the
    // reconnect backoff.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    m->channel = grpc::CreateCustomChannel(e, grpc::InsecureChannelCredentials(), args);
    m->kv = etcdserverpb::KV::NewStub(m->channel);
    m->lease = etcdserverpb::Lease::NewStub(m->channel);
    m->watch = etcdserverpb::Watch::NewStub(m->channel);
    members_.push_back(std::move(m));
  }
}

EtcdStore::~EtcdStore() = default;

void EtcdStore::SetDeadline(grpc::ClientContext* ctx) const {
  ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.request_timeout));
}

absl::Status EtcdStore::OnAnyMember(const std::function<absl::Status(Member&)>& call) {
  const size_t first = current_.load();
  absl::Status last;
  for (size_t i = 0; i < members_.size(); ++i) {
    const size_t k = (first + i) % members_.size();
    last = call(*members_[k]);
    if (!MemberDown(last)) {
      current_.store(k);
      return last;
    }
  }
  return last;
}

absl::StatusOr<std::optional<KeyValue>> EtcdStore::Get(const std::string& key) {
  std::optional<KeyValue> out;
  absl::Status s = OnAnyMember([&](Member& m) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    etcdserverpb::RangeResponse resp;
    absl::Status st = FromGrpc(m.kv->Range(&ctx, req, &resp), m.endpoint, "get " + key);
    if (st.ok() && resp.kvs_size() > 0) out = FromProto(resp.kvs(0));
    return st;
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<KeyValue>> EtcdStore::GetPrefix(const std::string& prefix) {
  std::vector<KeyValue> out;
  absl::Status s = OnAnyMember([&](Member& m) {
    out.clear();
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::RangeRequest req;
    req.set_key(prefix);
    req.set_range_end(PrefixRangeEnd(prefix));
    req.set_sort_order(etcdserverpb::RangeRequest::ASCEND);
    req.set_sort_target(etcdserverpb::RangeRequest::KEY);
    etcdserverpb::RangeResponse resp;
    absl::Status st = FromGrpc(m.kv->Range(&ctx, req, &resp), m.endpoint, "get " + prefix + "*");
    if (st.ok()) {
      for (const mvccpb::KeyValue& kv : resp.kvs()) out.push_back(FromProto(kv));
    }
    return st;
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<TxnResult> EtcdStore::Commit(const Txn& txn) {
  etcdserverpb::TxnRequest req;
  for (const Condition& c : txn.conditions) {
    etcdserverpb::Compare* cmp = req.add_compare();
    cmp->set_key(c.key);
    cmp->set_result(etcdserverpb::Compare::EQUAL);
    if (c.field == Condition::Field::kModRevision) {
      cmp->set_target(etcdserverpb::Compare::MOD);
      cmp->set_mod_revision(c.revision);
    } else {
      cmp->set_target(etcdserverpb::Compare::CREATE);
      cmp->set_create_revision(c.revision);
    }
  }
  for (const Put& p : txn.puts) {
    etcdserverpb::PutRequest* put = req.add_success()->mutable_request_put();
    put->set_key(p.key);
    put->set_value(p.value);
    put->set_lease(p.lease);
  }
  for (const std::string& key : txn.deletes) {
    req.add_success()->mutable_request_delete_range()->set_key(key);
  }
  TxnResult out;
  // A transaction whose answer was lost may have committed: it is not sent again to another
  // member (a retried compare-and-swap would then fail its own condition, which callers
  // handle by reading again, but a plain retry could apply the writes twice).
  bool sent = false;
  absl::Status s = OnAnyMember([&](Member& m) {
    if (sent) return absl::UnavailableError("etcd transaction's outcome unknown");
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::TxnResponse resp;
    const grpc::Status gs = m.kv->Txn(&ctx, req, &resp);
    // Only a refusal before anything reached the member may go to the next one.
    if (!gs.ok() && gs.error_code() != grpc::StatusCode::UNAVAILABLE) sent = true;
    absl::Status st = FromGrpc(gs, m.endpoint, "transaction");
    if (st.ok()) {
      out.committed = resp.succeeded();
      out.revision = resp.header().revision();
    }
    return st;
  });
  if (!s.ok()) return s;
  return out;
}

absl::StatusOr<LeaseId> EtcdStore::GrantLease(absl::Duration ttl) {
  const int64_t seconds = std::max<int64_t>(1, absl::ToInt64Seconds(absl::Ceil(ttl, absl::Seconds(1))));
  LeaseId id = kNoLease;
  absl::Status s = OnAnyMember([&](Member& m) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::LeaseGrantRequest req;
    req.set_ttl(seconds);
    etcdserverpb::LeaseGrantResponse resp;
    absl::Status st = FromGrpc(m.lease->LeaseGrant(&ctx, req, &resp), m.endpoint, "lease grant");
    if (st.ok() && !resp.error().empty()) {
      st = absl::UnavailableError(absl::StrCat("etcd at ", m.endpoint, ": lease grant: ", resp.error()));
    }
    if (st.ok()) id = resp.id();
    return st;
  });
  if (!s.ok()) return s;
  return id;
}

absl::StatusOr<absl::Duration> EtcdStore::KeepAlive(LeaseId lease) {
  absl::Duration ttl;
  absl::Status s = OnAnyMember([&](Member& m) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    auto stream = m.lease->LeaseKeepAlive(&ctx);
    etcdserverpb::LeaseKeepAliveRequest req;
    req.set_id(lease);
    etcdserverpb::LeaseKeepAliveResponse resp;
    if (!stream->Write(req) || !stream->Read(&resp)) {
      stream->WritesDone();
      absl::Status st = FromGrpc(stream->Finish(), m.endpoint, "lease keep-alive");
      return st.ok() ? absl::UnavailableError(absl::StrCat("etcd at ", m.endpoint,
                                                           ": lease keep-alive got no answer"))
                     : st;
    }
    stream->WritesDone();
    ctx.TryCancel();  // one renewal per call; the stream's end status is of no interest
    if (resp.ttl() <= 0) {
      return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " expired"));
    }
    ttl = absl::Seconds(resp.ttl());
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return ttl;
}

absl::Status EtcdStore::Revoke(LeaseId lease) {
  absl::Status s = OnAnyMember([&](Member& m) {
    grpc::ClientContext ctx;
    SetDeadline(&ctx);
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(lease);
    etcdserverpb::LeaseRevokeResponse resp;
    return FromGrpc(m.lease->LeaseRevoke(&ctx, req, &resp), m.endpoint, "lease revoke");
  });
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

namespace {

// One watch: a thread that holds a Watch stream on some member and, when the member goes
// away, opens it again on the next one from the revision after the last event delivered.
class EtcdWatch final : public Watch {
 public:
  using Open = std::function<std::unique_ptr<grpc::ClientReaderWriter<
      etcdserverpb::WatchRequest, etcdserverpb::WatchResponse>>(size_t member,
                                                                grpc::ClientContext*)>;

  EtcdWatch(std::string prefix, int64_t after_revision, size_t members, size_t first,
            absl::Duration give_up_after, Open open,
            std::function<void(const WatchEvent&)> on_event,
            std::function<void(const absl::Status&)> on_error)
      : prefix_(std::move(prefix)),
        next_revision_(after_revision + 1),
        members_(members),
        member_(first),
        give_up_after_(give_up_after),
        open_(std::move(open)),
        on_event_(std::move(on_event)),
        on_error_(std::move(on_error)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~EtcdWatch() override {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
      if (ctx_ != nullptr) ctx_->TryCancel();
    }
    thread_.join();
  }

 private:
  void Run() {
    absl::Time failing_since = absl::InfiniteFuture();
    absl::Status last = absl::UnavailableError("etcd watch never started");
    while (true) {
      grpc::ClientContext ctx;
      // A member cut off from its cluster's leader ends the watch instead of going quiet.
      ctx.AddMetadata("hasleader", "true");
      {
        absl::MutexLock l(&mu_);
        if (stop_) return;
        ctx_ = &ctx;
      }
      absl::Status broke = Stream(&ctx);
      {
        absl::MutexLock l(&mu_);
        ctx_ = nullptr;
        if (stop_) return;
      }
      if (broke.ok()) {  // the stream ran and then ended: a fresh failure window
        failing_since = absl::InfiniteFuture();
        continue;
      }
      if (absl::IsOutOfRange(broke)) {  // compacted: nothing to resume from
        on_error_(broke);
        return;
      }
      last = broke;
      if (failing_since == absl::InfiniteFuture()) failing_since = absl::Now();
      if (absl::Now() - failing_since > give_up_after_) {
        on_error_(absl::UnavailableError(
            absl::StrCat("etcd watch of ", prefix_, " found no member for ",
                         absl::FormatDuration(give_up_after_), ": ", last.message())));
        return;
      }
      member_ = (member_ + 1) % members_;
      absl::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(200));
      if (stop_) return;
    }
  }

  // One stream on member_: OK when it ended after working, an error when it never started
  // or the member went away (try the next), OutOfRange when the revision was compacted.
  absl::Status Stream(grpc::ClientContext* ctx) {
    auto stream = open_(member_, ctx);
    etcdserverpb::WatchRequest req;
    etcdserverpb::WatchCreateRequest* create = req.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixRangeEnd(prefix_));
    create->set_start_revision(next_revision_);
    if (!stream->Write(req)) {
      return absl::UnavailableError(absl::StrCat("watch on member ", member_, " did not start: ",
                                                 stream->Finish().error_message()));
    }
    bool created = false;
    etcdserverpb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.created()) created = true;
      if (resp.compact_revision() > 0 && resp.events_size() == 0) {
        return absl::OutOfRangeError(absl::StrCat(
            "etcd compacted past revision ", next_revision_, " (now ", resp.compact_revision(),
            "); read the state again and watch from there"));
      }
      if (resp.canceled()) {
        return absl::UnavailableError(absl::StrCat("etcd cancelled the watch: ",
                                                   resp.cancel_reason()));
      }
      for (const mvccpb::Event& e : resp.events()) {
        WatchEvent ev;
        ev.type = e.type() == mvccpb::Event::DELETE ? WatchEvent::Type::kDelete
                                                    : WatchEvent::Type::kPut;
        ev.kv = FromProto(e.kv());
        next_revision_ = e.kv().mod_revision() + 1;
        on_event_(ev);
      }
    }
    const grpc::Status end = stream->Finish();
    if (created) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat("watch on member ", member_, ": ",
                                               end.error_message()));
  }

  const std::string prefix_;
  int64_t next_revision_;  // only the watch's thread touches it
  const size_t members_;
  size_t member_;
  const absl::Duration give_up_after_;
  const Open open_;
  const std::function<void(const WatchEvent&)> on_event_;
  const std::function<void(const absl::Status&)> on_error_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* ctx_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Watch>> EtcdStore::WatchPrefix(
    const std::string& prefix, int64_t after_revision,
    std::function<void(const WatchEvent&)> on_event,
    std::function<void(const absl::Status&)> on_error) {
  if (after_revision < 0) {
    return absl::InvalidArgumentError("a watch starts after a revision >= 0");
  }
  auto open = [this](size_t member, grpc::ClientContext* ctx) {
    return members_[member]->watch->Watch(ctx);
  };
  const absl::Duration give_up = std::max(absl::Seconds(10), 5 * options_.request_timeout);
  return std::unique_ptr<Watch>(new EtcdWatch(prefix, after_revision, members_.size(),
                                              current_.load(), give_up, std::move(open),
                                              std::move(on_event), std::move(on_error)));
}

}  // namespace gcomp::coord
