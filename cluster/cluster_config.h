// The cluster's configuration file (YAML, or JSON which is a YAML subset) -> ClusterConfig.
//
//   absl::StatusOr<proto::ClusterConfig> config = LoadClusterConfig(path, {"workers=4"});
//
// Fields absent from the file keep the defaults of DefaultClusterConfig(); every error
// (unknown field, wrong type, value out of range) is InvalidArgument naming the field,
// e.g. "cluster config field 'uplink.rel_bits': must be in [0, 23], got 40".
// docs/SERVICE.md lists every field. Thread-compatible free functions.
#ifndef GCOMP_CLUSTER_CLUSTER_CONFIG_H_
#define GCOMP_CLUSTER_CLUSTER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/direction_codec.h"  // DirectionCodec, UplinkCodec: with the config
#include "codec/codec.h"
#include "proto/cluster_config.pb.h"

namespace gcomp::cluster {

proto::ClusterConfig DefaultClusterConfig();

// Parses `text` and applies `overrides`, each "field=value" with dotted field names
// ("uplink.mode=none"); "shards" takes a comma-separated list. Then validates.
absl::StatusOr<proto::ClusterConfig> ParseClusterConfig(
    absl::string_view text, const std::vector<std::string>& overrides = {});

// The most shards a config may list.
constexpr int kMaxShards = 4096;

// A config file larger than this is refused unread (a path pointed at /dev/zero).
constexpr uint64_t kMaxClusterConfigBytes = 16 << 20;

// Reads the file at `path` (NotFound if it cannot be read), then as ParseClusterConfig;
// a field given twice in `overrides` (--set flags) is an error naming both.
absl::StatusOr<proto::ClusterConfig> LoadClusterConfig(
    const std::string& path, const std::vector<std::string>& overrides = {});

absl::Status ValidateClusterConfig(const proto::ClusterConfig& config);

// The config of YAML `text` (with `overrides`) scaled to `count` shards: the file's
// `shards: {count: N, address: "...{index}..."}` expanded to `count` addresses, the rest
// unchanged (what a StatefulSet scaled to `count` pods serves). InvalidArgument naming
// `shards` when the file lists addresses instead of that form.
absl::StatusOr<proto::ClusterConfig> ScaledClusterConfig(absl::string_view text, uint32_t count,
                                                         const std::vector<std::string>& overrides = {});

// Where the shards of the config's job keep their checkpoint sets: checkpoint.dir/JOB, so
// jobs that share a volume never restore each other's state; bytes of the job other than
// letters, digits, '_', '-' and a '.' after the first are written %XX (space: %20). Empty
// without checkpoint.dir.
std::string JobCheckpointDir(const proto::ClusterConfig& config);

// Copies of each chunk's state the config asks for (`replicas`, 0 read as 1).
inline uint32_t Replicas(const proto::ClusterConfig& config) {
  return config.replicas() == 0 ? 1 : config.replicas();
}

// The YAML text of `config` (round-trips through ParseClusterConfig).
std::string ClusterConfigToYaml(const proto::ClusterConfig& config);

// A re-shard from `from` to `to` (docs/SERVICE.md, "Re-sharding"): `to` valid, its epoch
// higher, and nothing but `shards`, `shard_map_epoch` (and `down_shards`, a failover's)
// changed; no change of the shard count while a shard is down. InvalidArgument naming
// the field otherwise.
absl::Status ValidateReshard(const proto::ClusterConfig& from, const proto::ClusterConfig& to);

// The shard index of a StatefulSet pod from its name ("gcomp-shard-2" -> 2): the number
// after the last '-'. InvalidArgument naming the name when there is none.
absl::StatusOr<uint32_t> ShardFromPodName(absl::string_view name);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_CLUSTER_CONFIG_H_
