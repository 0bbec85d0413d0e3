// What each direction of the wire carries, from a cluster config: raw elements (mode
// "none") or GComp blocks with a policy. Apart from the config loader (cluster_config.h),
// so that wire blocks and their users need neither yaml-cpp nor the parser.
#ifndef GCOMP_CLUSTER_DIRECTION_CODEC_H_
#define GCOMP_CLUSTER_DIRECTION_CODEC_H_

#include <string>

#include "codec/codec.h"
#include "proto/block.pb.h"
#include "proto/cluster_config.pb.h"

namespace gcomp::cluster {

struct DirectionCodec {
  bool raw = false;
  codec::Policy policy;
  // How blocks sent this way are checksummed: XXH3 unless the receiver reads only XXH64
  // (proto::ChecksumKind).
  proto::ChecksumKind checksum = proto::CHECKSUM_XXH3_64;
};

// Require a validated config (ValidateClusterConfig).
DirectionCodec UplinkCodec(const proto::ClusterConfig& config);
DirectionCodec DownlinkCodec(const proto::ClusterConfig& config);

// One direction's setting in words, equal exactly for settings that code alike: "none",
// "lossless", "near-lossless (rel_bits 7, abs_log2 -16)" (any spelling the codec reads, and
// the bounds only where they count). A mode the codec does not know is quoted, clipped to
// 40 bytes (it may come from a peer): `unknown mode "zstd"`.
std::string DescribeCodec(const proto::CodecConfig& c);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_DIRECTION_CODEC_H_
