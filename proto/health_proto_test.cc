#include <string>

#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"
#include "proto/health.pb.h"

namespace gcomp::proto {
namespace {

TEST(HealthProto, PingResponseRoundTripsThroughWireFormat) {
  PingResponse sent;
  sent.set_process("gcomp_server shard 2");
  sent.set_uptime_ms(12345);
  std::string wire;
  ASSERT_TRUE(sent.SerializeToString(&wire));
  PingResponse got;
  ASSERT_TRUE(got.ParseFromString(wire));
  EXPECT_EQ(got.process(), "gcomp_server shard 2");
  EXPECT_EQ(got.uptime_ms(), 12345u);
}

TEST(HealthProto, GarbageIsRejected) {
  PingResponse got;
  EXPECT_FALSE(got.ParseFromString(std::string("\xff\xff\xff\xff", 4)));
}

TEST(HealthProto, ServiceStubIsGenerated) {
  EXPECT_STREQ(Admin::service_full_name(), "gcomp.proto.Admin");
}

}  // namespace
}  // namespace gcomp::proto
