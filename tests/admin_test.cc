// What a running shard answers besides aggregation: the standard grpc.health.v1 service
// and Admin.Ping, over real gRPC on loopback.
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/cluster_config.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "server/grpc_service.h"

namespace gcomp {
namespace {

class AdminTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<proto::ClusterConfig> config =
        cluster::ParseClusterConfig("job: admin\n", {"shards=127.0.0.1:1,127.0.0.1:2"});
    ASSERT_TRUE(config.ok()) << config.status();
    auto server = server::ShardServer::Start(*config, {1, 1, {}}, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                   grpc::InsecureChannelCredentials());
  }

  grpc::health::v1::HealthCheckResponse::ServingStatus Check(const std::string& service, grpc::Status* s) {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    *s = grpc::health::v1::Health::NewStub(channel_)->Check(&ctx, req, &resp);
    return resp.status();
  }

  std::unique_ptr<server::ShardServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(AdminTest, HealthIsServingForTheServerAndTheAggregationService) {
  using Response = grpc::health::v1::HealthCheckResponse;
  for (const std::string service : {"", "gcomp.proto.Aggregation"}) {
    grpc::Status s;
    EXPECT_EQ(Check(service, &s), Response::SERVING) << "service '" << service << "'";
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
}

TEST_F(AdminTest, HealthOfAnUnknownServiceIsNotFound) {
  grpc::Status s;
  Check("no.such.Service", &s);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(AdminTest, PingNamesTheProcessAndItsUptimeGrows) {
  auto stub = proto::Admin::NewStub(channel_);
  proto::PingRequest req;
  req.set_from("admin_test");
  proto::PingResponse first, second;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Ping(&ctx, req, &first).ok());
  }
  absl::SleepFor(absl::Milliseconds(30));
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->Ping(&ctx, req, &second).ok());
  }
  EXPECT_EQ(first.process(), "gcomp_server shard 1");
  EXPECT_GE(second.uptime_ms(), first.uptime_ms() + 30);
  EXPECT_LT(second.uptime_ms(), 60u * 1000u);
}

}  // namespace
}  // namespace gcomp
