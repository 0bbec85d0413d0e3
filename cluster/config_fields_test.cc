#include "cluster/config_fields.h"

#include <string>

#include "cluster/cluster_config.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace gcomp::cluster::config_fields {
namespace {

using ::testing::HasSubstr;

// A value each kind accepts and that differs from every default.
std::string SampleFor(Kind kind) {
  switch (kind) {
    case Kind::kString: return "sample";
    case Kind::kUnsigned: return "3";
    case Kind::kClampedInt: return "-3";
    case Kind::kDouble: return "0.25";
    case Kind::kShardList: return "h:1,h:2";
    case Kind::kStringList: return "e:1,e:2";
  }
  return "";
}

TEST(ConfigFields, EveryFieldIsSetWrittenAndReadBack) {
  for (const Field& f : All()) {
    proto::ClusterConfig c = Defaults();
    ASSERT_TRUE(Set(f, YAML::Node(SampleFor(f.kind)), &c).ok()) << f.name;
    EXPECT_FALSE(google::protobuf::util::MessageDifferencer::Equals(c, Defaults())) << f.name;
    YAML::Emitter out;
    Emit(c, out);
    // Read back field by field (not through ParseClusterConfig, whose validation the
    // sample values need not pass).
    proto::ClusterConfig back;
    YAML::Node root = YAML::Load(out.c_str());
    for (const Field& g : All()) {
      const std::string name = g.name;
      const size_t dot = name.find('.');
      YAML::Node node = dot == std::string::npos ? root[name]
                                                 : root[name.substr(0, dot)][name.substr(dot + 1)];
      ASSERT_TRUE(node.IsDefined()) << g.name << " missing from\n" << out.c_str();
      ASSERT_TRUE(Set(g, node, &back).ok()) << g.name;
    }
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(c, back))
        << f.name << "\n" << out.c_str();
  }
}

TEST(ConfigFields, DefaultsAreTheDocumentedOnes) {
  const proto::ClusterConfig c = Defaults();
  EXPECT_EQ(c.job(), "default");
  EXPECT_EQ(c.workers(), 1u);
  EXPECT_EQ(c.shard_map_epoch(), 1u);
  EXPECT_EQ(c.chunk_bytes(), 1u << 20);
  EXPECT_EQ(c.replicas(), 1u);
  for (const proto::CodecConfig& d : {c.uplink(), c.downlink()}) {
    EXPECT_EQ(d.mode(), "near-lossless");
    EXPECT_EQ(d.rel_bits(), 7);
    EXPECT_EQ(d.abs_log2(), -16);
  }
  EXPECT_EQ(c.optimizer().name(), "none");
  EXPECT_DOUBLE_EQ(c.optimizer().learning_rate(), 0.01);
  EXPECT_DOUBLE_EQ(c.optimizer().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer().epsilon(), 1e-8);
  EXPECT_EQ(c.step_timeout_ms(), 10000u);
  EXPECT_EQ(c.rpc_timeout_ms(), 30000u);
  EXPECT_EQ(c.max_retries(), 5u);
  EXPECT_EQ(c.retry_backoff_ms(), 50u);
  EXPECT_EQ(c.max_message_bytes(), 0u);
  EXPECT_EQ(c.security().cert_refresh_s(), 60u);
  EXPECT_EQ(c.limits().max_tensors(), 16384u);
  EXPECT_EQ(c.limits().max_pending_steps(), 65536u);
  EXPECT_EQ(c.limits().max_calls_per_client(), 1024u);
  EXPECT_EQ(c.checkpoint().keep(), 2u);
  EXPECT_TRUE(c.checkpoint().dir().empty());
}

TEST(ConfigFields, KindsRejectWhatTheyCannotHold) {
  proto::ClusterConfig c = Defaults();
  absl::Status s = Set(*Find("workers"), YAML::Node("4294967296"), &c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'workers': must be at most 4294967295"));
  s = Set(*Find("chunk_bytes"), YAML::Node("-1"), &c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected a non-negative integer"));
  s = Set(*Find("optimizer.epsilon"), YAML::Node("inf"), &c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'optimizer.epsilon': expected a finite number"));
  // Far out of range: refused naming the value as written (validation names the real range
  // of values nearer it).
  s = Set(*Find("uplink.rel_bits"), YAML::Node("99999"), &c);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'uplink.rel_bits': out of range, got 99999"));
  EXPECT_TRUE(Set(*Find("uplink.rel_bits"), YAML::Node("1000"), &c).ok());
  EXPECT_EQ(c.uplink().rel_bits(), 1000);
  EXPECT_EQ(Find("no_such_field"), nullptr);
  EXPECT_TRUE(IsGroup("limits"));
  EXPECT_FALSE(IsGroup("workers"));
  EXPECT_FALSE(IsGroup(""));
}

}  // namespace
}  // namespace gcomp::cluster::config_fields
