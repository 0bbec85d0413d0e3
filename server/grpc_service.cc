#include "server/grpc_service.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace gcomp::server {
namespace {

absl::Time DeadlineOf(const grpc::ServerContext* context) {
  const auto d = context->deadline();
  if (d == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(d);
}

}  // namespace

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status AggregationGrpcService::RegisterWorker(grpc::ServerContext*,
                                                    const proto::RegisterWorkerRequest* request,
                                                    proto::RegisterWorkerResponse* response) {
  return ToGrpc(shard_->RegisterWorker(*request, response));
}

grpc::Status AggregationGrpcService::DeclareTensor(grpc::ServerContext*,
                                                   const proto::DeclareTensorRequest* request,
                                                   proto::DeclareTensorResponse* response) {
  return ToGrpc(shard_->DeclareTensor(*request, response));
}

grpc::Status AggregationGrpcService::PushPull(grpc::ServerContext* context,
                                              const proto::CompressedBlock* request,
                                              proto::CompressedBlock* response) {
  return ToGrpc(shard_->PushPull(*request, DeadlineOf(context), response));
}

grpc::Status AggregationGrpcService::Pull(grpc::ServerContext*, const proto::PullRequest* request,
                                          proto::CompressedBlock* response) {
  return ToGrpc(shard_->Pull(*request, response));
}

grpc::Status AggregationGrpcService::Stats(grpc::ServerContext*, const proto::StatsRequest*,
                                           proto::StatsResponse* response) {
  shard_->Stats(response);
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(const proto::ClusterConfig& config,
                                                                const ShardOptions& options,
                                                                const std::string& listen_address) {
  absl::StatusOr<std::unique_ptr<ShardService>> service = ShardService::Create(config, options);
  if (!service.ok()) return service.status();
  std::unique_ptr<ShardServer> s(new ShardServer());
  s->service_ = *std::move(service);
  s->grpc_service_ = std::make_unique<AggregationGrpcService>(s->service_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen_address, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->grpc_service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(config.max_message_bytes()));
  builder.SetMaxSendMessageSize(static_cast<int>(config.max_message_bytes()));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen_address));
  }
  return s;
}

ShardServer::~ShardServer() { Shutdown(absl::ZeroDuration()); }

void ShardServer::Shutdown(absl::Duration grace) {
  if (shut_down_) return;
  shut_down_ = true;
  service_->Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void ShardServer::Wait() { server_->Wait(); }

}  // namespace gcomp::server
