#include "server/grpc_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "cluster/credentials.h"
#include "cluster/grpc_status.h"
#include "cluster/wire_block.h"
#include "grpcpp/impl/codegen/method_handler.h"
#include "grpcpp/impl/codegen/server_callback_handlers.h"
#include "grpcpp/impl/codegen/rpc_service_method.h"
#include "grpcpp/resource_quota.h"
#include "server/unparseable_request.h"

namespace gcomp::server {

using cluster::ToGrpc;
namespace {

absl::Time DeadlineOf(const grpc::ServerContextBase* context) {
  const auto d = context->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

// The checks come first in every method, before a call takes any resource: an address
// refused for replies it left unread, then the job token.
grpc::Status Authorize(const std::shared_ptr<cluster::JobToken>& token, UnreadReplies* unread,
                       const grpc::ServerContextBase* context, absl::string_view method) {
  if (unread != nullptr) {
    if (absl::Status s = unread->Admit(context->peer()); !s.ok()) return ToGrpc(s);
  }
  return ToGrpc(cluster::AuthorizeCall(token.get(), *context, method));
}

// "host" of "host:port" (also "[::1]" of "[::1]:port").
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

template <typename Request, typename Response>
void AggregationGrpcService::AddUnary(
    const char* name, grpc::Status (AggregationGrpcService::*method)(grpc::ServerContext*,
                                                                     const Request*, Response*)) {
  AddMethod(new grpc::internal::RpcServiceMethod(
      name, grpc::internal::RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<AggregationGrpcService, Request, Response>(
          [method](AggregationGrpcService* self, grpc::ServerContext* context,
                   const Request* request, Response* response) {
            return (self->*method)(context, request, response);
          },
          this)));
}

void AggregationGrpcService::RegisterMethods() {
  // The generated service's method names (aggregation.grpc.pb.cc); clients with the
  // generated stub call these (tests/service_test.cc).
  AddUnary("/gcomp.proto.Aggregation/RegisterWorker", &AggregationGrpcService::RegisterWorker);
  AddUnary("/gcomp.proto.Aggregation/DeclareTensor", &AggregationGrpcService::DeclareTensor);
  AddMethod(new grpc::internal::RpcServiceMethod(cluster::kPushPullMethod,
                                                 grpc::internal::RpcMethod::NORMAL_RPC, nullptr));
  MarkMethodCallback(
      2, new grpc::internal::CallbackUnaryHandler<PushPullRequest, cluster::WireMessage>(
             [this](grpc::CallbackServerContext* context, const PushPullRequest* request,
                    cluster::WireMessage* response) { return PushPull(context, request, response); }));
  AddUnary("/gcomp.proto.Aggregation/Pull", &AggregationGrpcService::Pull);
  AddUnary("/gcomp.proto.Aggregation/Stats", &AggregationGrpcService::Stats);
}

grpc::Status AggregationGrpcService::RegisterWorker(grpc::ServerContext* context,
                                                    const proto::RegisterWorkerRequest* request,
                                                    proto::RegisterWorkerResponse* response) {
  ShardMetrics::InFlight in_flight = shard_->metrics()->Track("RegisterWorker");
  if (grpc::Status s = Authorize(token_, unread_, context, "Aggregation.RegisterWorker"); !s.ok())
    return s;
  absl::StatusOr<CallLimiter::Slot> slot = limiter_.Acquire(context->peer());
  if (!slot.ok()) return ToGrpc(slot.status());
  return ToGrpc(shard_->RegisterWorker(*request, response, DeadlineOf(context)));
}

grpc::Status AggregationGrpcService::DeclareTensor(grpc::ServerContext* context,
                                                   const proto::DeclareTensorRequest* request,
                                                   proto::DeclareTensorResponse* response) {
  ShardMetrics::InFlight in_flight = shard_->metrics()->Track("DeclareTensor");
  if (grpc::Status s = Authorize(token_, unread_, context, "Aggregation.DeclareTensor"); !s.ok())
    return s;
  absl::StatusOr<CallLimiter::Slot> slot = limiter_.Acquire(context->peer());
  if (!slot.ok()) return ToGrpc(slot.status());
  return ToGrpc(shard_->DeclareTensor(*request, response, DeadlineOf(context)));
}

namespace {

// The reply's fields with this worker's id; the payload is the shared result itself.
absl::Status ShareReply(const proto::CompressedBlock& request,
                        std::shared_ptr<const proto::CompressedBlock> reply,
                        cluster::WireMessage* response) {
  proto::CompressedBlock header;
  header.mutable_address()->CopyFrom(reply->address());
  header.mutable_address()->set_worker(request.address().worker());
  header.set_dtype(reply->dtype());
  header.set_elements(reply->elements());
  header.set_codec(reply->codec());
  if (reply->has_policy()) *header.mutable_policy() = reply->policy();
  if (reply->has_sections()) *header.mutable_sections() = reply->sections();
  header.set_checksum(reply->checksum());
  header.set_checksum_kind(reply->checksum_kind());
  // A push checked by XXH64 may come from a worker that reads nothing else.
  if (request.checksum_kind() == proto::CHECKSUM_XXH64) {
    const absl::string_view data = reply->data();
    if (absl::Status c = cluster::UseXxh64(&header, cluster::WirePieces(&data, 1)); !c.ok()) {
      return c;
    }
  }
  *response = cluster::WireMessage::Share(std::move(header), std::move(reply));
  return absl::OkStatus();
}

}  // namespace

grpc::ServerUnaryReactor* AggregationGrpcService::PushPull(grpc::CallbackServerContext* context,
                                                           const PushPullRequest* call,
                                                           cluster::WireMessage* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  ShardMetrics::InFlight in_flight = shard_->metrics()->Track("PushPull");
  grpc::Status s = Authorize(token_, unread_, context, "Aggregation.PushPull");
  if (s.ok()) s = call->parsed;
  if (!s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  const cluster::WireMessage* request = &call->message;
  absl::StatusOr<CallLimiter::Slot> slot = limiter_.Acquire(context->peer());
  if (!slot.ok()) {
    reactor->Finish(ToGrpc(slot.status()));
    return reactor;
  }
  // Ids out of range are refused by the shard before any wait.
  std::optional<CallLimiter::Slot> worker_slot;
  const uint32_t worker = request->header().address().worker();
  if (worker < shard_->config().workers()) {
    absl::StatusOr<CallLimiter::Slot> w = worker_limiter_.Acquire(absl::StrCat("worker ", worker));
    if (!w.ok()) {
      reactor->Finish(ToGrpc(w.status()));
      return reactor;
    }
    worker_slot.emplace(*std::move(w));
  }
  struct Held {  // released before the answer goes out, as a returning handler's were
    ShardMetrics::InFlight in_flight;
    CallLimiter::Slot slot;
    std::optional<CallLimiter::Slot> worker_slot;
  };
  auto held = std::make_unique<Held>(
      Held{std::move(in_flight), *std::move(slot), std::move(worker_slot)});
  shard_->PushPullAsync(
      request->header(), request->data(), DeadlineOf(context),
      [reactor, request, response, held = std::move(held)](
          absl::Status s, std::shared_ptr<const proto::CompressedBlock> reply) mutable {
        if (s.ok()) s = ShareReply(request->header(), std::move(reply), response);
        held.reset();
        reactor->Finish(ToGrpc(s));
      });
  return reactor;
}

grpc::Status AggregationGrpcService::Pull(grpc::ServerContext* context,
                                          const proto::PullRequest* request,
                                          proto::CompressedBlock* response) {
  ShardMetrics::InFlight in_flight = shard_->metrics()->Track("Pull");
  if (grpc::Status s = Authorize(token_, unread_, context, "Aggregation.Pull"); !s.ok()) return s;
  absl::StatusOr<CallLimiter::Slot> slot = limiter_.Acquire(context->peer());
  if (!slot.ok()) return ToGrpc(slot.status());
  return ToGrpc(shard_->Pull(*request, response, DeadlineOf(context)));
}

grpc::Status AggregationGrpcService::Stats(grpc::ServerContext* context, const proto::StatsRequest*,
                                           proto::StatsResponse* response) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Aggregation.Stats"); !s.ok()) return s;
  shard_->Stats(response);
  return grpc::Status::OK;
}

grpc::Status ReshardingGrpcService::Prepare(grpc::ServerContext* context,
                                            const proto::PrepareReshardRequest* request,
                                            proto::PrepareReshardResponse* response) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.Prepare"); !s.ok()) return s;
  absl::StatusOr<proto::PrepareReshardResponse> r = shard_->PrepareReshard(*request);
  if (!r.ok()) return ToGrpc(r.status());
  *response = *std::move(r);
  return grpc::Status::OK;
}

grpc::Status ReshardingGrpcService::Commit(grpc::ServerContext* context,
                                           const proto::CommitReshardRequest* request,
                                           proto::CommitReshardResponse*) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.Commit"); !s.ok()) return s;
  return ToGrpc(shard_->CommitReshard(request->next_epoch(), request->switch_step()));
}

grpc::Status ReshardingGrpcService::Abort(grpc::ServerContext* context,
                                          const proto::AbortReshardRequest* request,
                                          proto::AbortReshardResponse*) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.Abort"); !s.ok()) return s;
  return ToGrpc(shard_->AbortReshard(request->next_epoch(), request->reason()));
}

grpc::Status ReshardingGrpcService::Transfer(grpc::ServerContext* context,
                                             const proto::TransferRequest* request,
                                             proto::TransferResponse*) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.Transfer"); !s.ok())
    return s;
  return ToGrpc(shard_->AcceptTransfer(*request, DeadlineOf(context)));
}

grpc::Status ReshardingGrpcService::GetConfig(grpc::ServerContext* context,
                                              const proto::GetConfigRequest*,
                                              proto::ClusterConfig* response) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.GetConfig"); !s.ok())
    return s;
  *response = shard_->CurrentConfig();
  // File paths of this process mean nothing to the caller.
  response->mutable_security()->clear_token_file();
  response->mutable_security()->clear_key_file();
  return grpc::Status::OK;
}

grpc::Status ReshardingGrpcService::ReshardStatus(grpc::ServerContext* context,
                                                  const proto::ReshardStatusRequest*,
                                                  proto::ReshardStatusResponse* response) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.ReshardStatus"); !s.ok())
    return s;
  shard_->ReshardStatus(response);
  return grpc::Status::OK;
}

grpc::Status ReshardingGrpcService::Replicate(grpc::ServerContext* context,
                                              const proto::ReplicateRequest* request,
                                              proto::ReplicateResponse*) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.Replicate"); !s.ok())
    return s;
  return ToGrpc(shard_->AcceptReplica(*request));
}

grpc::Status ReshardingGrpcService::ReportDown(grpc::ServerContext* context,
                                               const proto::ReportDownRequest* request,
                                               proto::ReportDownResponse* response) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.ReportDown"); !s.ok())
    return s;
  return ToGrpc(shard_->ReportDown(*request, response));
}

grpc::Status ReshardingGrpcService::InstallMap(grpc::ServerContext* context,
                                               const proto::InstallMapRequest* request,
                                               proto::InstallMapResponse*) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.InstallMap"); !s.ok())
    return s;
  return ToGrpc(shard_->InstallMap(*request));
}

grpc::Status ReshardingGrpcService::Rejoin(grpc::ServerContext* context,
                                           const proto::RejoinRequest* request,
                                           proto::RejoinResponse* response) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Resharding.Rejoin"); !s.ok()) return s;
  return ToGrpc(shard_->Rejoin(*request, response));
}

namespace {

// How long a control call waits for a connection to a peer.
constexpr absl::Duration kPeerConnectWait = absl::Seconds(1);
// How long a replication retry does: enough for a channel between two reconnect attempts
// (100 ms apart at first); a backup still not there is reported, and the coordinator's
// probe decides.
constexpr absl::Duration kReplicaConnectWait = absl::Milliseconds(300);

// Calls on peer shards, one channel per address. Moved chunk state (Send) retries
// UNAVAILABLE (a peer still switching, or restarting) for up to a minute.
class PeerTransport {
 public:
  static absl::StatusOr<std::shared_ptr<PeerTransport>> Create(const proto::ClusterConfig& config) {
    absl::StatusOr<cluster::ClientSecurity> security = cluster::MakeClientSecurity(config);
    if (!security.ok()) return security.status();
    auto t = std::shared_ptr<PeerTransport>(new PeerTransport(*std::move(security)));
    t->max_message_bytes_ = static_cast<int>(config.max_message_bytes() != 0
                                                 ? config.max_message_bytes()
                                                 : 2 * config.chunk_bytes() + (1 << 20));
    return t;
  }

  absl::Status Send(const std::string& address, const proto::TransferRequest& request) {
    proto::Resharding::Stub* stub = StubFor(address);
    constexpr absl::Duration kBudget = absl::Seconds(60);
    const absl::Time give_up = absl::Now() + kBudget;
    absl::Duration backoff = absl::Milliseconds(20);
    while (true) {
      grpc::ClientContext ctx;
      ctx.set_wait_for_ready(true);
      ctx.set_deadline(absl::ToChronoTime(std::min(give_up, absl::Now() + absl::Seconds(20))));
      {
        absl::MutexLock lock(&mu_);
        if (stopped_) return absl::UnavailableError("shard shutting down: moved chunks not sent");
        sending_.insert(&ctx);
      }
      proto::TransferResponse response;
      grpc::Status st = stub->Transfer(&ctx, request, &response);
      {
        absl::MutexLock lock(&mu_);
        sending_.erase(&ctx);
      }
      if (st.ok()) return absl::OkStatus();
      // A busy refusal: the receiver's bound on calls waiting for the new map was full.
      const bool retry = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                         st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
                         cluster::IsBusyRefusal(st);
      if (!retry || absl::Now() + backoff >= give_up) {
        return cluster::FromGrpc(st, absl::StrCat("sending moved chunks to ", address));
      }
      absl::SleepFor(backoff);
      backoff = std::min(backoff * 2, absl::Seconds(1));
    }
  }

  // Replication is on the step's critical path and a dead backup must be noticed fast:
  // no waiting for a connection at first, one short retry that waits for one; a busy
  // backup (alive) is retried for 0.6 s.
  absl::Status Replicate(const std::string& address, const proto::ReplicateRequest& request) {
    constexpr int kAttempts = 6;
    grpc::Status st;
    bool waited_for_ready = false;
    for (int attempt = 0; attempt < kAttempts; ++attempt) {
      grpc::ClientContext ctx;
      // The retry waits for a connection (a channel may be between reconnect attempts).
      ctx.set_wait_for_ready(waited_for_ready);
      ctx.set_deadline(absl::ToChronoTime(
          absl::Now() + (waited_for_ready ? kReplicaConnectWait : absl::Seconds(10))));
      proto::ReplicateResponse response;
      st = StubFor(address)->Replicate(&ctx, request, &response);
      if (st.error_code() == grpc::StatusCode::UNAVAILABLE && !waited_for_ready) {
        waited_for_ready = true;
      } else if (cluster::IsBusyRefusal(st) && attempt + 1 < kAttempts) {
        // A backup busy with other calls is alive: its refusal would fail this step for
        // every worker. Backs off 20 ms to 320 ms (0.6 s in all); none after the last try.
        absl::SleepFor(absl::Milliseconds(20 << attempt));
      } else {
        break;
      }
    }
    return cluster::FromGrpc(st, absl::StrCat("replicating to ", address));
  }

  absl::Status ReportDown(const std::string& address, const proto::ReportDownRequest& request,
                          proto::ReportDownResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    return cluster::FromGrpc(StubFor(address)->ReportDown(&ctx, request, response),
                             absl::StrCat("reporting a shard down to ", address));
  }

  absl::Status InstallMap(const std::string& address, const proto::InstallMapRequest& request) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kPeerConnectWait * 3));
    proto::InstallMapResponse response;
    return cluster::FromGrpc(StubFor(address)->InstallMap(&ctx, request, &response),
                             absl::StrCat("installing a map on ", address));
  }

  absl::StatusOr<proto::ReshardStatusResponse> Status(const std::string& address,
                                                      absl::Duration timeout) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);  // a peer just starting (or restarting) gets `timeout`
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    proto::ReshardStatusResponse response;
    grpc::Status st = StubFor(address)->ReshardStatus(&ctx, proto::ReshardStatusRequest(), &response);
    if (!st.ok()) return cluster::FromGrpc(st, absl::StrCat("status of ", address));
    return response;
  }

  absl::Status Rejoin(const std::string& address, const proto::RejoinRequest& request,
                      proto::RejoinResponse* response) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    return cluster::FromGrpc(StubFor(address)->Rejoin(&ctx, request, response),
                             absl::StrCat("asking ", address, " to rejoin"));
  }

  absl::Status Probe(const std::string& address, absl::Duration timeout) {
    grpc::ClientContext ctx;
    ctx.set_wait_for_ready(true);  // a peer counts down only if no connection comes in time
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    proto::ClusterConfig config;
    return cluster::FromGrpc(StubFor(address)->GetConfig(&ctx, proto::GetConfigRequest(), &config),
                             absl::StrCat("probing ", address));
  }

  // At shutdown: the calls of Send in flight are cancelled and later ones refused, so that
  // a peer that does not answer cannot hold the shard's exit for Send's minute of retries.
  void Stop() {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (grpc::ClientContext* ctx : sending_) ctx->TryCancel();
  }

 private:
  explicit PeerTransport(cluster::ClientSecurity security) : security_(std::move(security)) {}

  proto::Resharding::Stub* StubFor(const std::string& address) {
    absl::MutexLock lock(&mu_);
    std::unique_ptr<proto::Resharding::Stub>& stub = stubs_[address];
    if (stub == nullptr) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(max_message_bytes_);
      args.SetMaxSendMessageSize(max_message_bytes_);
      // A peer that was down (or not yet up) is reached again within a fraction of a
      // second, not after gRPC's default backoff of up to minutes.
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      stub = proto::Resharding::NewStub(security_.NewChannel(address, args));
    }
    return stub.get();
  }

  const cluster::ClientSecurity security_;
  int max_message_bytes_ = 0;
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<proto::Resharding::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> sending_ ABSL_GUARDED_BY(mu_);  // Send's calls in flight
};

}  // namespace

grpc::Status AdminGrpcService::Ping(grpc::ServerContext* context, const proto::PingRequest*,
                                    proto::PingResponse* response) {
  if (grpc::Status s = Authorize(token_, unread_, context, "Admin.Ping"); !s.ok()) return s;
  response->set_process(process_);
  response->set_uptime_ms(static_cast<uint64_t>(absl::ToInt64Milliseconds(absl::Now() - started_)));
  return grpc::Status::OK;
}

TransportLimits TransportLimitsFor(const proto::ClusterConfig& config) {
  // The calls a job keeps in flight to one shard: every worker's pushes, with room for the
  // peers' transfers and replicas, the admin tool and retries. A worker pushes several
  // tensors at once (the PyTorch hook 4 buckets, max_inflight chunks each), and each push
  // waits on a request thread: the threads, and so each worker's share of them, allow for
  // kTensorsAtOnce (a review's 16-worker job, 4 tensors at once, was refused at 12 calls).
  constexpr uint64_t kTensorsAtOnce = 4;
  const uint64_t calls =
      uint64_t{config.workers()} * std::max<uint32_t>(1, config.max_inflight_chunks());
  TransportLimits l;
  l.max_threads =
      static_cast<int>(std::clamp<uint64_t>(2 * calls * kTensorsAtOnce + 64, 256, 16384));
  l.memory_bytes = static_cast<size_t>(std::min<uint64_t>(
      (2 * calls + 16) * config.max_message_bytes() + (uint64_t{64} << 20), uint64_t{1} << 40));
  l.max_streams_per_connection = static_cast<int>(
      std::clamp<uint64_t>(uint64_t{config.limits().max_calls_per_client()} + 16, 1, 1u << 20));
  l.max_connections =
      config.limits().max_connections() != 0
          ? config.limits().max_connections()
          : std::max<uint64_t>(4096,
                               4 * uint64_t{config.workers()} * config.channels_per_shard() + 256);
  return l;
}

uint32_t WorkerShareOfThreads(const proto::ClusterConfig& config) {
  const uint64_t threads = static_cast<uint64_t>(TransportLimitsFor(config).max_threads);
  const uint64_t share = (threads - 64) / std::max<uint32_t>(1, config.workers());
  return static_cast<uint32_t>(std::clamp<uint64_t>(
      share, 2 * uint64_t{std::max<uint32_t>(1, config.max_inflight_chunks())}, UINT32_MAX));
}

namespace {

// Compressed requests are refused on their headers (UNIMPLEMENTED, "Compression algorithm
// ... is disabled"), before any message is read. gRPC checks max_message_bytes only after
// inflating one, so 1 MiB of gzip from a peer without the token made the shard allocate
// 1 GiB. Payloads are GComp frames already; nothing gains from gzip on top. Messages that
// still arrive marked compressed are left as they are, and do not parse.
void RefuseCompressedRequests(grpc::ServerBuilder* builder) {
  builder->SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder->SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  builder->AddChannelArgument(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
}

}  // namespace

// Streams one connection to the plaintext health port may have open.
constexpr uint32_t kHealthStreams = 8;

void ApplyTransportLimits(const proto::ClusterConfig& config, grpc::ServerBuilder* builder) {
  RefuseCompressedRequests(builder);
  const TransportLimits l = TransportLimitsFor(config);
  grpc::ResourceQuota quota("gcomp_shard");
  quota.Resize(l.memory_bytes);
  quota.SetMaxThreads(l.max_threads);
  builder->SetResourceQuota(quota);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, l.max_streams_per_connection);
  builder->AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, l.idle_connection_ms);
}

UnreadReplies::Options UnreadRepliesOptionsFor(const proto::ClusterConfig& config,
                                               std::function<void(uint64_t)> on_cancelled) {
  UnreadReplies::Options o;
  // Half the request threads: every call a job keeps in flight (max_threads / 2 - 32 when
  // that is above 256), and one address cannot take them all for long.
  o.max_per_address = static_cast<uint32_t>(TransportLimitsFor(config).max_threads / 2);
  // A worker's call has given up by then.
  o.timeout = absl::Milliseconds(std::max<uint32_t>(config.rpc_timeout_ms(), 1000));
  o.on_cancelled = std::move(on_cancelled);
  o.never_refused.assign(config.limits().never_refused().begin(),
                         config.limits().never_refused().end());
  return o;
}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(const proto::ClusterConfig& config,
                                                                const ShardOptions& options,
                                                                const std::string& listen_address) {
  absl::StatusOr<std::shared_ptr<PeerTransport>> peers = PeerTransport::Create(config);
  if (!peers.ok()) return peers.status();
  ShardOptions with_peers = options;
  // Half the request threads for calls that wait for an epoch; the rest stay free for
  // pushes of the current map, stats, admin calls and the re-shard's own messages.
  const TransportLimits limits = TransportLimitsFor(config);
  with_peers.max_waiting_for_epoch = static_cast<uint32_t>(limits.max_threads / 2);
  with_peers.peers.send_transfer = [peers = *peers](const std::string& address,
                                              const proto::TransferRequest& request) {
    return peers->Send(address, request);
  };
  with_peers.peers.send_replica = [peers = *peers](const std::string& address,
                                             const proto::ReplicateRequest& request) {
    return peers->Replicate(address, request);
  };
  with_peers.peers.report_down = [peers = *peers](const std::string& address,
                                            const proto::ReportDownRequest& request,
                                            proto::ReportDownResponse* response) {
    return peers->ReportDown(address, request, response);
  };
  with_peers.peers.install_map = [peers = *peers](const std::string& address,
                                            const proto::InstallMapRequest& request) {
    return peers->InstallMap(address, request);
  };
  with_peers.peers.probe = [peers = *peers](const std::string& address, absl::Duration timeout) {
    return peers->Probe(address, timeout);
  };
  with_peers.peers.status = [peers = *peers](const std::string& address, absl::Duration timeout) {
    return peers->Status(address, timeout);
  };
  with_peers.peers.rejoin = [peers = *peers](const std::string& address,
                                             const proto::RejoinRequest& request,
                                             proto::RejoinResponse* response) {
    return peers->Rejoin(address, request, response);
  };
  // Etcd first: a second process started as this shard stops here, before it listens.
  // The callbacks reach the service once it exists (the state outlives none of its calls).
  std::unique_ptr<ClusterState> cluster_state;
  auto target = std::make_shared<std::atomic<ShardService*>>(nullptr);
  if (!config.coordination().etcd().empty()) {
    ClusterStateOptions co;
    co.shard = options.shard;
    co.on_map = [target](const proto::ShardMapRecord& record) {
      if (ShardService* svc = target->load()) svc->OnCommittedMap(record);
    };
    co.on_member_lost = [target](uint32_t k, const std::string& why) {
      if (ShardService* svc = target->load()) svc->OnMemberLost(k, why);
    };
    absl::StatusOr<std::unique_ptr<ClusterState>> joined = ClusterState::Join(config, co);
    if (!joined.ok()) {
      return absl::Status(joined.status().code(),
                          absl::StrCat("coordination.etcd: ", joined.status().message()));
    }
    cluster_state = *std::move(joined);
    with_peers.cluster_state = cluster_state.get();
  }
  absl::StatusOr<std::unique_ptr<ShardService>> service = ShardService::Create(config, with_peers);
  if (!service.ok()) return service.status();
  // Owned by the server from here on, so that every way out destroys the state first.
  std::unique_ptr<ShardServer> s(new ShardServer());
  s->service_ = *std::move(service);
  s->cluster_state_ = std::move(cluster_state);
  target->store(s->service_.get());
  absl::StatusOr<cluster::ServerSecurity> security = cluster::MakeServerSecurity(config);
  if (!security.ok()) return security.status();
  s->stop_peers_ = [peers = *peers] { peers->Stop(); };
  s->unread_replies_ = std::make_shared<UnreadReplies>(UnreadRepliesOptionsFor(
      config,
      [metrics = s->service_->metrics()](uint64_t n) { metrics->CountUnreadRepliesCancelled(n); }));
  UnreadReplies* unread = s->unread_replies_.get();
  s->grpc_service_ =
      std::make_unique<AggregationGrpcService>(s->service_.get(), security->token, unread);
  s->reshard_service_ =
      std::make_unique<ReshardingGrpcService>(s->service_.get(), security->token, unread);
  s->admin_service_ = std::make_unique<AdminGrpcService>(
      absl::StrCat("gcomp_server shard ", options.shard), absl::Now(), security->token, unread);
  // Replicated: a shard that restarts into a running job must not serve before it has
  // caught up (checked once it listens, since the peers then call it).
  s->service_->HoldForRejoinCheck();
  grpc::EnableDefaultHealthCheckService(true);
  StreamGuard::Options guarding;
  guarding.max_message_bytes = config.max_message_bytes();
  guarding.never_refused.assign(config.limits().never_refused().begin(),
                                config.limits().never_refused().end());
  guarding.on_closed = [metrics = s->service_->metrics()](uint64_t n) {
    metrics->CountStreamLimitClosures(n);
  };
  guarding.on_refused = [metrics = s->service_->metrics()] {
    metrics->CountRefusedAddressConnection();
  };
  s->stream_guard_ = std::make_unique<StreamGuard>(std::move(guarding));
  StreamGuard* guard = s->stream_guard_.get();
  ListenerOptions listening;
  listening.max_connections = limits.max_connections;
  listening.cap_name = "limits.max_connections";
  const uint32_t max_streams = static_cast<uint32_t>(limits.max_streams_per_connection);
  listening.admit = [guard](int fd) { return guard->Admit(fd); };
  listening.on_accepted = [guard, max_streams](int fd) { guard->Track(fd, max_streams); };
  absl::StatusOr<std::unique_ptr<Listener>> listener = Listener::Bind(listen_address, listening);
  if (!listener.ok()) return listener.status();
  s->listener_ = *std::move(listener);
  s->port_ = s->listener_->port();
  grpc::ServerBuilder builder;
  ApplyTransportLimits(config, &builder);
  auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
      security->credentials);
  builder.RegisterService(s->grpc_service_.get());
  builder.RegisterService(s->reshard_service_.get());
  builder.RegisterService(s->admin_service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> intercept;
  intercept.push_back(std::make_unique<UnreadRepliesInterceptorFactory>(s->unread_replies_));
  intercept.push_back(std::make_unique<UnparseableRequestInterceptorFactory>(
      std::vector<std::string>{cluster::kPushPullMethod}));
  builder.experimental().SetInterceptorCreators(std::move(intercept));
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes()));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot start the gRPC server for ", listen_address));
  }
  s->unread_replies_->StartWatchdog();
  s->listener_->Start(std::move(acceptor));
  if (grpc::HealthCheckServiceInterface* health = s->server_->GetHealthCheckService()) {
    health->SetServingStatus(proto::Aggregation::service_full_name(), s->service_->Ready().ok());
  }
  s->stream_guard_->Start();
  s->service_->StartRejoinCheck();
  if (security->tls && config.security().health_port() != 0) {
    // Plaintext, so only the health service may be reachable here: no Aggregation, no
    // Admin, and the generic service answers UNIMPLEMENTED for anything else.
    const std::string health_address =
        absl::StrCat(HostOf(listen_address), ":", config.security().health_port());
    s->health_only_ = std::make_unique<grpc::CallbackGenericService>();
    ListenerOptions health_listening = listening;
    health_listening.on_accepted = [guard](int fd) { guard->Track(fd, kHealthStreams); };
    absl::StatusOr<std::unique_ptr<Listener>> health =
        Listener::Bind(health_address, health_listening);
    if (!health.ok()) {
      return absl::UnavailableError(
          absl::StrCat(health.status().message(), " (security.health_port)"));
    }
    s->health_listener_ = *std::move(health);
    s->health_port_ = s->health_listener_->port();
    grpc::ServerBuilder health_builder;
    RefuseCompressedRequests(&health_builder);
    // Anyone who reaches this port is served, without a certificate or the token, and it
    // answers probes only: a quota and a stream limit of its own, small, so that Watch
    // streams by the thousand on one connection cannot grow the shard through it. (Its
    // connections count toward limits.max_connections with the main port's.)
    grpc::ResourceQuota health_quota("gcomp_health");
    health_quota.Resize(16 << 20);
    health_quota.SetMaxThreads(8);
    health_builder.SetResourceQuota(health_quota);
    health_builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kHealthStreams);
    health_builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, limits.idle_connection_ms);
    auto health_acceptor = health_builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        grpc::InsecureServerCredentials());
    health_builder.RegisterCallbackGenericService(s->health_only_.get());
    s->health_server_ = health_builder.BuildAndStart();
    if (s->health_server_ == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot start the gRPC server for ",
                                                 health_address, " (security.health_port)"));
    }
    s->health_listener_->Start(std::move(health_acceptor));
    if (grpc::HealthCheckServiceInterface* health = s->health_server_->GetHealthCheckService()) {
      health->SetServingStatus(proto::Aggregation::service_full_name(), s->service_->Ready().ok());
    }
  }
  s->readiness_thread_ = std::thread([p = s.get()] { p->ReadinessLoop(); });
  return s;
}

ShardServer::~ShardServer() { Shutdown(absl::ZeroDuration()); }

void ShardServer::ReadinessLoop() {
  std::optional<bool> shown;  // what the loop last set (the start set the same rule's answer)
  std::string why;
  while (true) {
    {
      absl::MutexLock lock(&readiness_mu_);
      if (readiness_mu_.AwaitWithTimeout(absl::Condition(&readiness_stop_),
                                         absl::Milliseconds(250))) {
        return;
      }
    }
    const absl::Status now = service_->Ready();
    if (shown == now.ok() && (now.ok() || now.message() == why)) continue;
    const bool ready = now.ok();
    const bool changed = shown.has_value() ? *shown != ready : !ready;
    shown = ready;
    why = std::string(now.message());
    for (grpc::Server* server : {server_.get(), health_server_.get()}) {
      if (server == nullptr || server->GetHealthCheckService() == nullptr) continue;
      server->GetHealthCheckService()->SetServingStatus(proto::Aggregation::service_full_name(),
                                                        ready);
    }
    if (!changed && ready) continue;
    if (ready) {
      log::Info("shard {}: ready (health of {} SERVING)", service_->shard(),
                proto::Aggregation::service_full_name());
    } else {
      log::Info("shard {}: not ready (health of {} NOT_SERVING): {}", service_->shard(),
                proto::Aggregation::service_full_name(), why);
    }
  }
}

void ShardServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  {
    absl::MutexLock lock(&readiness_mu_);
    readiness_stop_ = true;
  }
  if (readiness_thread_.joinable()) readiness_thread_.join();
  if (stop_peers_) stop_peers_();
  service_->Shutdown();
  // Probes see NOT_SERVING while calls drain, then no listener at all.
  if (health_server_ != nullptr && health_server_->GetHealthCheckService() != nullptr) {
    health_server_->GetHealthCheckService()->Shutdown();
  }
  // No new connections from here on (gRPC's own listener closed at Shutdown too).
  if (listener_ != nullptr) listener_->Stop();
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  if (health_listener_ != nullptr) health_listener_->Stop();
  if (health_server_ != nullptr) health_server_->Shutdown(absl::ToChronoTime(absl::Now()));
}

void ShardServer::Wait() { server_->Wait(); }

}  // namespace gcomp::server
