#include "gtest/gtest.h"
#include "proto/block.pb.h"

namespace {

TEST(BlockProto, RoundTripsAddressAndPayload) {
  gcomp::proto::CompressedBlock block;
  block.mutable_address()->set_key("w");
  block.mutable_address()->set_step(7);
  block.set_codec(gcomp::proto::CODEC_RAW);
  block.set_data(std::string("\x01\x02\x03\x04", 4));
  gcomp::proto::CompressedBlock copy;
  ASSERT_TRUE(copy.ParseFromString(block.SerializeAsString()));
  EXPECT_EQ(copy.address().key(), "w");
  EXPECT_EQ(copy.address().step(), 7);
  EXPECT_EQ(copy.data().size(), 4u);
}

}  // namespace
