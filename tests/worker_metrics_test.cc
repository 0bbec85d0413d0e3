// A worker's /metrics endpoint (ClientOptions::metrics_address) over real HTTP, against an
// in-process shard: the counters equal Client::stats().

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/testing/http_get.h"
#include "server/grpc_service.h"
#include "worker/client.h"

namespace gcomp {
namespace {

using ::testing::HasSubstr;

TEST(WorkerMetrics, ServedCountersMatchClientStats) {
  absl::StatusOr<proto::ClusterConfig> config =
      cluster::ParseClusterConfig("job: m\nworkers: 1\nshards: [127.0.0.1:1]\nchunk_bytes: 4096\n");
  ASSERT_TRUE(config.ok()) << config.status();
  auto shard = server::ShardServer::Start(*config, {0, 1, {}}, "127.0.0.1:0");
  ASSERT_TRUE(shard.ok()) << shard.status();
  config->set_shards(0, absl::StrCat("127.0.0.1:", (*shard)->port()));
  worker::ClientOptions options;
  options.metrics_address = "127.0.0.1:0";
  auto client = worker::Client::Connect(*config, options);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_GT((*client)->metrics_port(), 0);
  std::vector<float> g(5000, 0.25f), out(5000);
  ASSERT_TRUE((*client)->Declare("g", codec::DType::kF32, g.size()).ok());
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE((*client)->PushPull("g", step, g.data(), out.data()).ok());
  }
  const worker::ClientStats st = (*client)->stats();
  const std::string text = testing::HttpGet((*client)->metrics_port());
  const std::string labels = "gcomp_job=\"m\",worker=\"0\"";
  EXPECT_THAT(text, HasSubstr(absl::StrCat("gcomp_worker_raw_bytes_total{", labels,
                                           ",direction=\"sent\"} ", st.raw_bytes_sent)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("gcomp_worker_wire_bytes_total{", labels,
                                           ",direction=\"received\"} ", st.wire_bytes_received)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("gcomp_worker_chunks_total{", labels, "} ", st.chunks)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("gcomp_worker_push_pull_seconds_count{", labels, "} 3")));
  EXPECT_EQ(st.raw_bytes_sent, 3u * 5000 * 4);

  // A busy port is a clear error from Connect.
  options.metrics_address = absl::StrCat("127.0.0.1:", (*client)->metrics_port());
  auto second = worker::Client::Connect(*config, options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("cannot serve metrics"));
}

}  // namespace
}  // namespace gcomp
