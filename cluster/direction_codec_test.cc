#include "cluster/direction_codec.h"

#include <string>

#include "gtest/gtest.h"

namespace gcomp::cluster {
namespace {

proto::CodecConfig Codec(const std::string& mode, int rel_bits, int abs_log2) {
  proto::CodecConfig c;
  c.set_mode(mode);
  c.set_rel_bits(rel_bits);
  c.set_abs_log2(abs_log2);
  return c;
}

TEST(DescribeCodec, EqualExactlyForSettingsThatCodeAlike) {
  EXPECT_EQ(DescribeCodec(Codec("none", 7, -16)), "none");
  // The bounds do not count outside near-lossless.
  EXPECT_EQ(DescribeCodec(Codec("lossless", 7, -16)), DescribeCodec(Codec("lossless", 2, -4)));
  EXPECT_EQ(DescribeCodec(Codec("lossless", 7, -16)), "lossless");
  EXPECT_EQ(DescribeCodec(Codec("near-lossless", 7, -16)),
            "near-lossless (rel_bits 7, abs_log2 -16)");
  // Any spelling the codec reads.
  EXPECT_EQ(DescribeCodec(Codec("near_lossless", 7, -16)),
            DescribeCodec(Codec("near-lossless", 7, -16)));
  EXPECT_NE(DescribeCodec(Codec("near-lossless", 7, -16)),
            DescribeCodec(Codec("near-lossless", 2, -16)));
  EXPECT_NE(DescribeCodec(Codec("near-lossless", 7, -16)),
            DescribeCodec(Codec("near-lossless", 7, -4)));
}

TEST(DescribeCodec, AnUnknownModeIsQuotedAndClipped) {
  EXPECT_EQ(DescribeCodec(Codec("zstd", 0, 0)), "unknown mode \"zstd\"");
  EXPECT_EQ(DescribeCodec(Codec(std::string(1000, 'x') + "\x1b", 0, 0)),
            "unknown mode \"" + std::string(40, 'x') + "\"");
  EXPECT_EQ(DescribeCodec(Codec("a\x1b[2J", 0, 0)), "unknown mode \"a\\u001b[2J\"");
}

}  // namespace
}  // namespace gcomp::cluster
