#include "cluster/direction_codec.h"

#include "absl/strings/str_cat.h"
#include "base/json.h"
#include "base/utf8.h"

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

std::string DescribeCodec(const proto::CodecConfig& c) {
  if (c.mode() == "none") return "none";
  const absl::StatusOr<codec::Mode> mode = codec::ParseMode(c.mode());
  if (!mode.ok()) return absl::StrCat("unknown mode ", JsonQuote(Utf8Prefix(c.mode(), 40)));
  if (*mode == codec::Mode::kLossless) return "lossless";
  return absl::StrCat("near-lossless (rel_bits ", c.rel_bits(), ", abs_log2 ", c.abs_log2(), ")");
}

}  // namespace gcomp::cluster
