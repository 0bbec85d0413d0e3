// Device tensors through the worker library: a worker whose gradient lives in CUDA memory
// (GPU codec) and one whose gradient lives in host memory (CPU codec) push-pull together
// through real shards on loopback. Both must receive identical bytes, and the device
// worker's Pull must match. Tagged `gpu`; skips without a device.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_config.h"
#include "gpu/runtime.h"
#include "gtest/gtest.h"
#include "server/grpc_service.h"
#include "tests/synthetic_gradient.h"
#include "worker/client.h"

namespace gcomp {
namespace {

worker::ClientOptions Worker(uint32_t w) {
  worker::ClientOptions o;
  o.worker = w;
  return o;
}

using testing::SyntheticGradient;

void RunMode(const std::string& mode) {
  SCOPED_TRACE(mode);
  const size_t n = 300000;  // several chunks of 256 KiB over 2 shards
  absl::StatusOr<proto::ClusterConfig> parsed = cluster::ParseClusterConfig(
      "job: device\n", {"workers=2", "shards=127.0.0.1:1,127.0.0.1:2", "uplink.mode=" + mode,
                        "downlink.mode=" + mode, "chunk_bytes=262144"});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  proto::ClusterConfig config = *parsed;
  config.clear_shards();
  std::vector<std::unique_ptr<server::ShardServer>> shards;
  for (uint32_t k = 0; k < 2; ++k) {
    auto s = server::ShardServer::Start(*parsed, {k, 2, {}}, "127.0.0.1:0");
    ASSERT_TRUE(s.ok()) << s.status();
    config.add_shards(absl::StrCat("127.0.0.1:", (*s)->port()));
    shards.push_back(*std::move(s));
  }
  std::vector<std::unique_ptr<worker::Client>> clients;
  for (uint32_t w = 0; w < 2; ++w) {
    auto c = worker::Client::Connect(config, Worker(w));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Declare("t", codec::DType::kF32, n).ok());
    clients.push_back(*std::move(c));
  }
  const std::vector<float> g0 = SyntheticGradient(n, 1), g1 = SyntheticGradient(n, 2);
  auto in_dev = gpu::DeviceBuffer::Allocate(n * 4);
  auto out_dev = gpu::DeviceBuffer::Allocate(n * 4);
  ASSERT_TRUE(in_dev.ok() && out_dev.ok());
  ASSERT_EQ(cudaMemcpy(in_dev->data(), g0.data(), n * 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> host_out(n);
  auto device_done = clients[0]->PushPullAsync("t", 0, in_dev->data(), out_dev->data());
  auto host_done = clients[1]->PushPullAsync("t", 0, g1.data(), host_out.data());
  ASSERT_TRUE(device_done.get().ok());
  ASSERT_TRUE(host_done.get().ok());
  std::vector<float> device_out(n);
  ASSERT_EQ(cudaMemcpy(device_out.data(), out_dev->data(), n * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(0, std::memcmp(device_out.data(), host_out.data(), n * 4));
  ASSERT_TRUE(clients[0]->Pull("t", out_dev->data()).ok());
  ASSERT_EQ(cudaMemcpy(device_out.data(), out_dev->data(), n * 4, cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(0, std::memcmp(device_out.data(), host_out.data(), n * 4));
  if (mode != "near-lossless") {
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(host_out[i], (g0[i] + g1[i]) / 2.0f) << i;
  }
}

TEST(DevicePushPull, DeviceAndHostWorkersGetIdenticalResults) {
  if (!gpu::Available()) GTEST_SKIP() << "no GPU: " << gpu::AvailabilityStatus().message();
  for (const char* mode : {"none", "lossless", "near-lossless"}) RunMode(mode);
}

TEST(DevicePushPull, MixedHostAndDeviceBuffersAreRejected) {
  if (!gpu::Available()) GTEST_SKIP() << "no GPU: " << gpu::AvailabilityStatus().message();
  // Checked before any network traffic, so an unreachable shard list is fine here.
  absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig(
      "job: device\n", {"workers=1", "shards=127.0.0.1:1"});
  ASSERT_TRUE(config.ok());
  auto s = server::ShardServer::Start(*config, {0, 1, {}}, "127.0.0.1:0");
  ASSERT_TRUE(s.ok());
  proto::ClusterConfig real = *config;
  real.clear_shards();
  real.add_shards(absl::StrCat("127.0.0.1:", (*s)->port()));
  auto c = worker::Client::Connect(real, Worker(0));
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->Declare("t", codec::DType::kF32, 16).ok());
  auto dev = gpu::DeviceBuffer::Allocate(64);
  ASSERT_TRUE(dev.ok());
  std::vector<float> host(16);
  EXPECT_EQ((*c)->PushPull("t", 0, dev->data(), host.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gcomp
