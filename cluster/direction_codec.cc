#include "cluster/direction_codec.h"

namespace gcomp::cluster {
namespace {

DirectionCodec ToDirection(const proto::CodecConfig& c) {
  DirectionCodec d;
  d.raw = c.mode() == "none";
  if (!d.raw) {
    d.policy.mode = *codec::ParseMode(c.mode());
    d.policy.rel_bits = c.rel_bits();
    d.policy.abs_log2 = c.abs_log2();
  }
  return d;
}

}  // namespace

DirectionCodec UplinkCodec(const proto::ClusterConfig& config) {
  return ToDirection(config.uplink());
}

DirectionCodec DownlinkCodec(const proto::ClusterConfig& config) {
  return ToDirection(config.downlink());
}

}  // namespace gcomp::cluster
