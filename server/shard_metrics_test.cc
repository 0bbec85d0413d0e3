#include "server/shard_metrics.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_config.h"
#include "cluster/wire_block.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/shard_service.h"

namespace gcomp::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(ShardMetrics, CountersFollowPushesAndSteps) {
  absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig(
      "job: j\nworkers: 1\nshards: [127.0.0.1:1]\nchunk_bytes: 64\n"
      "uplink: {mode: lossless}\ndownlink: {mode: lossless}\n");
  ASSERT_TRUE(config.ok()) << config.status();
  auto shard = *ShardService::Create(*config, ShardOptions{});
  proto::DeclareTensorRequest d;
  d.set_job("j");
  d.set_key("w");
  d.set_dtype(proto::DTYPE_F32);
  d.set_elements(20);  // chunks of 16 and 4 elements
  d.set_shard_map_epoch(1);
  proto::DeclareTensorResponse dr;
  ASSERT_TRUE(shard->DeclareTensor(d, &dr).ok());

  std::vector<float> v(16, 0.5f);
  proto::CompressedBlock b, out;
  ASSERT_TRUE(cluster::EncodeWireBlock(cluster::UplinkCodec(*config), codec::DType::kF32, v.data(),
                                       16, &b)
                  .ok());
  b.mutable_address()->set_job("j");
  b.mutable_address()->set_key("w");
  b.mutable_address()->set_shard_map_epoch(1);
  const uint64_t wire_in = b.data().size();
  ASSERT_TRUE(shard->PushPull(b, absl::Now() + absl::Seconds(5), &out).ok());
  ASSERT_TRUE(shard->PushPull(b, absl::Now() + absl::Seconds(5), &out).ok());  // a retry
  proto::CompressedBlock bad = b;
  bad.mutable_address()->set_key("nope");
  EXPECT_FALSE(shard->PushPull(bad, absl::Now() + absl::Seconds(5), &out).ok());

  shard->metrics()->CountUnreadRepliesCancelled(3);
  shard->metrics()->CountStreamLimitClosures(2);
  shard->metrics()->CountRefusedAddressConnection();

  const std::string text = shard->metrics()->Text();
  const std::string labels = "gcomp_job=\"j\",shard=\"0\"";
  EXPECT_THAT(text, HasSubstr("gcomp_shard_pushes_total{" + labels + ",code=\"OK\"} 2"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_pushes_total{" + labels + ",code=\"NOT_FOUND\"} 1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_duplicate_pushes_total{" + labels + "} 1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_unread_replies_cancelled_total{" + labels + "} 3"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_stream_limit_closures_total{" + labels + "} 2"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_refused_address_connections_total{" + labels + "} 1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_raw_bytes_total{" + labels + ",direction=\"in\"} 128"));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("gcomp_shard_wire_bytes_total{", labels,
                                           ",direction=\"in\"} ", 2 * wire_in)));
  EXPECT_THAT(text, HasSubstr(absl::StrCat("gcomp_shard_wire_bytes_total{", labels,
                                           ",direction=\"out\"} ", 2 * out.data().size())));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_steps_completed_total{" + labels + "} 1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_step_duration_seconds_count{" + labels + "} 1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_step_phase_seconds_count{" + labels +
                                  ",phase=\"decode\"} 1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_codec_bytes_total{" + labels + ",op=\"encode\"} 64"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_tensors{" + labels + "} 1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_chunks_owned{" + labels + "} 2"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_map_epoch{" + labels + "} 1"));
  EXPECT_THAT(text, Not(HasSubstr("key=")));  // never a tensor key as a label
  // What the checkpoint alert compares: the newest step completed here (step 0 above), no
  // checkpoint written, none configured.
  EXPECT_THAT(text, HasSubstr("gcomp_shard_completed_step{" + labels + "} 0"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_checkpoint_last_step{" + labels + "} -1"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_checkpoint_last_timestamp_seconds{" + labels + "} 0"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_checkpoint_every_steps{" + labels + "} 0"));
  EXPECT_THAT(text, HasSubstr("gcomp_shard_reshard_in_progress{" + labels + "} 0"));
  shard->metrics()->SetCheckpointInterval(50);
  shard->metrics()->ObserveCheckpoint(1000, 0.5, 99);
  const std::string after = shard->metrics()->Text();
  EXPECT_THAT(after, HasSubstr("gcomp_shard_checkpoint_every_steps{" + labels + "} 50"));
  EXPECT_THAT(after, HasSubstr("gcomp_shard_checkpoint_last_step{" + labels + "} 99"));
  EXPECT_THAT(after, Not(HasSubstr("gcomp_shard_checkpoint_last_timestamp_seconds{" + labels +
                                   "} 0\n")));
}

TEST(ShardMetrics, CallsInFlightAndRefusals) {
  ShardMetrics m("j", 3);
  {
    ShardMetrics::InFlight a = m.Track("PushPull");
    ShardMetrics::InFlight b = m.Track("PushPull");
    EXPECT_THAT(m.Text(), HasSubstr("gcomp_grpc_calls_in_flight{gcomp_job=\"j\",shard=\"3\",method=\"PushPull\"} 2"));
  }
  EXPECT_THAT(m.Text(), HasSubstr("gcomp_grpc_calls_in_flight{gcomp_job=\"j\",shard=\"3\",method=\"PushPull\"} 0"));
  AdmissionUsage usage;
  usage.refused = 4;
  usage.memory_bytes = 100;
  m.SetAdmission(usage, 1000);
  m.SetAdmission(usage, 1000);  // the same refusals are not counted twice
  EXPECT_THAT(m.Text(), HasSubstr("gcomp_shard_limit_refusals_total{gcomp_job=\"j\",shard=\"3\"} 4"));
  EXPECT_THAT(m.Text(), HasSubstr("gcomp_shard_memory_used_bytes{gcomp_job=\"j\",shard=\"3\"} 100"));
  EXPECT_THAT(m.Text(), HasSubstr("gcomp_shard_memory_budget_bytes{gcomp_job=\"j\",shard=\"3\"} 1000"));
  EXPECT_THAT(m.Text(), HasSubstr("gcomp_shard_reshard_requested{gcomp_job=\"j\",shard=\"3\"} 0"));
  m.SetReshardRequested(true);
  EXPECT_THAT(m.Text(), HasSubstr("gcomp_shard_reshard_requested{gcomp_job=\"j\",shard=\"3\"} 1"));
}

}  // namespace
}  // namespace gcomp::server
