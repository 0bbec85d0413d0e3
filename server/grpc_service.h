// Thin gRPC adapters: proto in, a call on ShardService, grpc::Status out.
#ifndef GCOMP_SERVER_GRPC_SERVICE_H_
#define GCOMP_SERVER_GRPC_SERVICE_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/job_token.h"
#include "cluster/wire_message.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "proto/aggregation.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "proto/reshard.grpc.pb.h"
#include "server/call_limiter.h"
#include "server/listener.h"
#include "server/cluster_state.h"
#include "server/shard_service.h"
#include "server/stream_guard.h"
#include "server/unread_replies.h"

namespace gcomp::server {

// PushPull's request. gRPC 1.51's callback API answers a request that does not parse
// UNIMPLEMENTED with no message; the parse's own status (INVALID_ARGUMENT naming what is
// wrong) is kept here for the handler to answer instead.
struct PushPullRequest {
  cluster::WireMessage message;
  grpc::Status parsed;
};

}  // namespace gcomp::server

namespace grpc {
template <>
class SerializationTraits<gcomp::server::PushPullRequest> {
 public:
  static Status Serialize(const gcomp::server::PushPullRequest& request, ByteBuffer* out,
                          bool* own_buffer) {
    return SerializationTraits<gcomp::cluster::WireMessage>::Serialize(request.message, out,
                                                                       own_buffer);
  }
  static Status Deserialize(ByteBuffer* in, gcomp::server::PushPullRequest* request) {
    request->parsed =
        SerializationTraits<gcomp::cluster::WireMessage>::Deserialize(in, &request->message);
    return Status::OK;
  }
};
}  // namespace grpc

namespace gcomp::server {

// The PushPull calls one worker id may have in flight on a shard: an even share of the
// request threads (TransportLimitsFor's max_threads) less 64 kept for other calls, at
// least twice max_inflight_chunks.
uint32_t WorkerShareOfThreads(const proto::ClusterConfig& config);

// Aggregation, registered by hand rather than through the generated Aggregation::Service:
// PushPull takes and answers cluster::WireMessage (the same bytes on the wire), so a
// pushed payload is decoded from the slices it arrived in and the step's result is sent
// from the shard's one copy, shared by every worker's reply.
class AggregationGrpcService final : public grpc::Service {
 public:
  // `shard` is borrowed and must outlive this service. With a `token`, every call must
  // carry it (cluster::AuthorizeCall). With `unread`, calls from an address it refuses are
  // refused first (borrowed, must outlive this service).
  explicit AggregationGrpcService(ShardService* shard,
                                  std::shared_ptr<cluster::JobToken> token = nullptr,
                                  UnreadReplies* unread = nullptr)
      : shard_(shard),
        token_(std::move(token)),
        unread_(unread),
        limiter_(shard->config().limits().max_calls_per_client()),
        worker_limiter_(WorkerShareOfThreads(shard->config()),
                        "each worker's share of the shard's request threads") {
    RegisterMethods();
  }

  grpc::Status RegisterWorker(grpc::ServerContext* context, const proto::RegisterWorkerRequest* request,
                              proto::RegisterWorkerResponse* response);
  grpc::Status DeclareTensor(grpc::ServerContext* context, const proto::DeclareTensorRequest* request,
                             proto::DeclareTensorResponse* response);
  // On gRPC's callback API: a push waiting for the rest of its step holds no thread; the
  // step's end answers it from the shard's pool.
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const PushPullRequest* call, cluster::WireMessage* response);
  grpc::Status Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                    proto::CompressedBlock* response);
  grpc::Status Stats(grpc::ServerContext* context, const proto::StatsRequest* request,
                     proto::StatsResponse* response);

 private:
  ShardService* shard_;
  const std::shared_ptr<cluster::JobToken> token_;  // null: calls are not checked
  UnreadReplies* const unread_;                     // null: no address is refused
  CallLimiter limiter_;  // every call but Stats holds a slot while it runs
  // PushPull calls per worker id, whatever connections they come on: one client claiming
  // a worker id must not hold the calls (and their request bytes) the other workers need.
  CallLimiter worker_limiter_;

  void RegisterMethods();
  template <typename Request, typename Response>
  void AddUnary(const char* name,
                grpc::Status (AggregationGrpcService::*method)(grpc::ServerContext*, const Request*,
                                                               Response*));
};

// Resharding: the coordinator's and the peer shards' side of a live re-shard.
class ReshardingGrpcService final : public proto::Resharding::Service {
 public:
  // `shard` (and `unread`, if any) are borrowed and must outlive this service.
  explicit ReshardingGrpcService(ShardService* shard,
                                 std::shared_ptr<cluster::JobToken> token = nullptr,
                                 UnreadReplies* unread = nullptr)
      : shard_(shard), token_(std::move(token)), unread_(unread) {}

  grpc::Status Prepare(grpc::ServerContext* context, const proto::PrepareReshardRequest* request,
                       proto::PrepareReshardResponse* response) override;
  grpc::Status Commit(grpc::ServerContext* context, const proto::CommitReshardRequest* request,
                      proto::CommitReshardResponse* response) override;
  grpc::Status Abort(grpc::ServerContext* context, const proto::AbortReshardRequest* request,
                     proto::AbortReshardResponse* response) override;
  grpc::Status Transfer(grpc::ServerContext* context, const proto::TransferRequest* request,
                        proto::TransferResponse* response) override;
  grpc::Status GetConfig(grpc::ServerContext* context, const proto::GetConfigRequest* request,
                         proto::ClusterConfig* response) override;
  grpc::Status ReshardStatus(grpc::ServerContext* context,
                             const proto::ReshardStatusRequest* request,
                             proto::ReshardStatusResponse* response) override;
  grpc::Status Replicate(grpc::ServerContext* context, const proto::ReplicateRequest* request,
                         proto::ReplicateResponse* response) override;
  grpc::Status ReportDown(grpc::ServerContext* context, const proto::ReportDownRequest* request,
                          proto::ReportDownResponse* response) override;
  grpc::Status InstallMap(grpc::ServerContext* context, const proto::InstallMapRequest* request,
                          proto::InstallMapResponse* response) override;
  grpc::Status Rejoin(grpc::ServerContext* context, const proto::RejoinRequest* request,
                      proto::RejoinResponse* response) override;

 private:
  ShardService* shard_;
  const std::shared_ptr<cluster::JobToken> token_;
  UnreadReplies* const unread_;
};

// Admin.Ping: who answered and for how long it has been up.
class AdminGrpcService final : public proto::Admin::Service {
 public:
  // `process` names the answering process, e.g. "gcomp_server shard 2". With a `token`,
  // calls must carry it; `unread` as for AggregationGrpcService.
  AdminGrpcService(std::string process, absl::Time started,
                   std::shared_ptr<cluster::JobToken> token = nullptr,
                   UnreadReplies* unread = nullptr)
      : process_(std::move(process)),
        started_(started),
        token_(std::move(token)),
        unread_(unread) {}

  grpc::Status Ping(grpc::ServerContext* context, const proto::PingRequest* request,
                    proto::PingResponse* response) override;

 private:
  const std::string process_;
  const absl::Time started_;
  const std::shared_ptr<cluster::JobToken> token_;
  UnreadReplies* const unread_;
};

// What a peer can make gRPC itself hold, before any message reaches the shard's own
// limits (which see only whole messages). Without these, a peer that opens streams and
// never finishes a message holds up to max_message_bytes of buffers per stream, and one
// that holds calls open holds a thread per call, neither counted anywhere.
struct TransportLimits {
  // gRPC's buffers for all connections (its resource quota): twice the messages a job has
  // in flight to a shard, plus 64 MiB. Past it gRPC refuses new streams and closes
  // connections to free memory.
  size_t memory_bytes = 0;
  // Handler threads in all (gRPC's thread quota): twice the calls in flight with 4 tensors
  // per worker at once (2 W x max_inflight_chunks x 4), plus 64, at least 256. Calls past
  // it get RESOURCE_EXHAUSTED.
  int max_threads = 0;
  // HTTP/2 streams one connection may have open: limits.max_calls_per_client + 16, so that
  // a client past that limit still gets the shard's own refusal, which names it.
  int max_streams_per_connection = 0;
  // A connection with no call for this long is closed (a peer reconnects as it needs to):
  // idle connections otherwise hold a file descriptor each for good.
  int idle_connection_ms = 5 * 60 * 1000;
  // Connections held at once (server/listener.h), each 5 KiB (silent) to 22 KiB (HTTP/2
  // preface sent) of gRPC's: limits.max_connections, or max(4096, 4 x workers x
  // channels_per_shard + 256).
  uint64_t max_connections = 0;
};
TransportLimits TransportLimitsFor(const proto::ClusterConfig& config);
// The limits above, and compressed requests refused before they are inflated.
void ApplyTransportLimits(const proto::ClusterConfig& config, grpc::ServerBuilder* builder);

// What a client may leave unread (server/unread_replies.h): half of max_threads from one
// address for a second, each reply for rpc_timeout_ms.
UnreadReplies::Options UnreadRepliesOptionsFor(const proto::ClusterConfig& config,
                                               std::function<void(uint64_t)> on_cancelled);

// A running shard: ShardService + gRPC server (Aggregation, Admin, and the standard
// grpc.health.v1 service, SERVING for "" and "gcomp.proto.Aggregation" until Shutdown).
// The port speaks what the config's `security` says (cluster/credentials.h): mutual TLS
// or plaintext, with the job token checked on every call but grpc.health.v1. With TLS and
// security.health_port, a second, plaintext server on that port serves grpc.health.v1
// only (every other method is UNIMPLEMENTED there), for probes that speak no TLS.
class ShardServer {
 public:
  // Listens on `listen_address` ("host:port"; port 0 picks a free one, see port()); the
  // health port, if any, on the same host.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(const proto::ClusterConfig& config,
                                                            const ShardOptions& options,
                                                            const std::string& listen_address);
  ~ShardServer();

  int port() const { return port_; }
  // The plaintext health port; 0 when there is none.
  int health_port() const { return health_port_; }
  ShardService* service() { return service_.get(); }
  // The cluster's state in etcd; null without coordination.etcd.
  ClusterState* cluster_state() { return cluster_state_.get(); }
  // Ends waits (Unavailable), then stops accepting and drains calls within `grace`.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  void Wait();

 private:
  ShardServer() = default;
  // Replies not read in time (declared first: the servers' calls end before it goes).
  // Shared with every call's interceptor, which gRPC may end after the server is gone.
  std::shared_ptr<UnreadReplies> unread_replies_;
  std::unique_ptr<ShardService> service_;
  // The cluster's state in etcd (config coordination.etcd), or null. Declared after the
  // service, so it goes first: its callbacks into the service have stopped by then.
  std::unique_ptr<ClusterState> cluster_state_;
  // Cancels the peer calls that could hold the exit (moved chunks to a peer that does not
  // answer).
  std::function<void()> stop_peers_;
  std::unique_ptr<AggregationGrpcService> grpc_service_;
  std::unique_ptr<ReshardingGrpcService> reshard_service_;
  std::unique_ptr<AdminGrpcService> admin_service_;
  std::unique_ptr<grpc::Server> server_;
  // Shuts down connections past their stream cap (declared between the server and the
  // listeners: it stops after they stop handing it connections, before gRPC goes).
  std::unique_ptr<StreamGuard> stream_guard_;
  // Accepts for server_ (gRPC's own listener stops for good at the first accept() that
  // fails for want of a descriptor) and closes connections past max_connections.
  std::unique_ptr<Listener> listener_;
  int port_ = 0;
  // Answers UNIMPLEMENTED on the health-only server; its registration is also what lets
  // that server start with no service of its own besides the default health service.
  std::unique_ptr<grpc::CallbackGenericService> health_only_;
  std::unique_ptr<grpc::Server> health_server_;  // null without a health port
  std::unique_ptr<Listener> health_listener_;
  int health_port_ = 0;
  bool shut_down_ = false;
  // Readiness: the health status of "gcomp.proto.Aggregation" follows ShardService::Ready
  // (liveness, the "" service, stays SERVING until Shutdown).
  void ReadinessLoop();
  absl::Mutex readiness_mu_;
  bool readiness_stop_ ABSL_GUARDED_BY(readiness_mu_) = false;
  std::thread readiness_thread_;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_GRPC_SERVICE_H_
