// Thin gRPC adapters: proto in, a call on ShardService, grpc::Status out.
#ifndef GCOMP_SERVER_GRPC_SERVICE_H_
#define GCOMP_SERVER_GRPC_SERVICE_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "proto/aggregation.grpc.pb.h"
#include "server/shard_service.h"

namespace gcomp::server {

grpc::Status ToGrpc(const absl::Status& status);

class AggregationGrpcService final : public proto::Aggregation::Service {
 public:
  // `shard` is borrowed and must outlive this service.
  explicit AggregationGrpcService(ShardService* shard) : shard_(shard) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context, const proto::RegisterWorkerRequest* request,
                              proto::RegisterWorkerResponse* response) override;
  grpc::Status DeclareTensor(grpc::ServerContext* context, const proto::DeclareTensorRequest* request,
                             proto::DeclareTensorResponse* response) override;
  grpc::Status PushPull(grpc::ServerContext* context, const proto::CompressedBlock* request,
                        proto::CompressedBlock* response) override;
  grpc::Status Pull(grpc::ServerContext* context, const proto::PullRequest* request,
                    proto::CompressedBlock* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const proto::StatsRequest* request,
                     proto::StatsResponse* response) override;

 private:
  ShardService* shard_;
};

// A running shard: ShardService + gRPC server (aggregation and grpc.health.v1).
class ShardServer {
 public:
  // Listens on `listen_address` ("host:port"; port 0 picks a free one, see port()).
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(const proto::ClusterConfig& config,
                                                            const ShardOptions& options,
                                                            const std::string& listen_address);
  ~ShardServer();

  int port() const { return port_; }
  ShardService* service() { return service_.get(); }
  // Ends waits (Unavailable), then stops accepting and drains calls within `grace`.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  void Wait();

 private:
  ShardServer() = default;
  std::unique_ptr<ShardService> service_;
  std::unique_ptr<AggregationGrpcService> grpc_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_GRPC_SERVICE_H_
