// One 64 MiB tensor through 2 shards and 2 workers (near-lossless), over loopback gRPC.
#include <cmath>
#include <future>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "cluster/cluster_config.h"
#include "server/grpc_service.h"
#include "worker/client.h"

namespace gcomp {
namespace {

worker::ClientOptions Worker(uint32_t w) {
  worker::ClientOptions o;
  o.worker = w;
  return o;
}

TEST(Large, SixtyFourMebibyteTensor) {
  const size_t n = (size_t{64} << 20) / 4;
  auto config = *cluster::ParseClusterConfig(
      "job: big\nworkers: 2\nshards: ['127.0.0.1:1', '127.0.0.1:2']\n"
      "step_timeout_ms: 60000\nrpc_timeout_ms: 120000\n");
  std::vector<std::unique_ptr<server::ShardServer>> shards;
  proto::ClusterConfig client_config = config;
  client_config.clear_shards();
  for (uint32_t k = 0; k < 2; ++k) {
    shards.push_back(*server::ShardServer::Start(config, {k, 2, {}}, "127.0.0.1:0"));
    client_config.add_shards(absl::StrCat("127.0.0.1:", shards.back()->port()));
  }
  std::vector<std::vector<float>> in(2, std::vector<float>(n)), out(2, std::vector<float>(n));
  for (size_t i = 0; i < n; ++i) {
    in[0][i] = std::sin(0.001f * i) * 1e-2f;
    in[1][i] = std::cos(0.003f * i) * 1e-2f;
  }
  std::vector<std::unique_ptr<worker::Client>> clients;
  for (uint32_t w = 0; w < 2; ++w) {
    clients.push_back(*worker::Client::Connect(client_config, Worker(w)));
    ASSERT_TRUE(clients.back()->Declare("big", codec::DType::kF32, n).ok());
  }
  auto a = clients[0]->PushPullAsync("big", 0, in[0].data(), out[0].data());
  auto b = clients[1]->PushPullAsync("big", 0, in[1].data(), out[1].data());
  ASSERT_TRUE(a.get().ok());
  ASSERT_TRUE(b.get().ok());
  EXPECT_EQ(out[0], out[1]);
  double max_err = 0;
  for (size_t i = 0; i < n; ++i) {
    max_err = std::max(max_err, std::fabs(double(out[0][i]) - (in[0][i] + in[1][i]) / 2.0));
  }
  // Relative 2^-8 of values below 1e-2, plus the floor: well under 1e-4.
  EXPECT_LT(max_err, 1e-4);
  EXPECT_LT(clients[0]->stats().wire_bytes_sent, clients[0]->stats().raw_bytes_sent);
}

}  // namespace
}  // namespace gcomp
