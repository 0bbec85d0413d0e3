#include "cluster/config_flags.h"

#include "absl/flags/flag.h"
#include "cluster/cluster_config.h"

ABSL_FLAG(std::string, config, "", "Cluster config file (YAML or JSON).");
ABSL_FLAG(std::vector<std::string>, set, {},
          "Config overrides, comma-separated field=value (e.g. workers=4,uplink.mode=none).");

namespace gcomp::cluster {

absl::StatusOr<proto::ClusterConfig> LoadClusterConfigFromFlags() {
  return LoadClusterConfig(absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_set));
}

}  // namespace gcomp::cluster
