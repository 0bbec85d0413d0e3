// --config and --set, the flags of every program that reads the cluster config (shard,
// worker, admin), defined once here. A binary gets them by depending on this target; its
// main() reads them after absl::ParseCommandLine, through LoadClusterConfigFromFlags or
// the flags themselves where it needs the path (a watcher, a rewrite).
#ifndef GCOMP_CLUSTER_CONFIG_FLAGS_H_
#define GCOMP_CLUSTER_CONFIG_FLAGS_H_

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "proto/cluster_config.pb.h"

ABSL_DECLARE_FLAG(std::string, config);
ABSL_DECLARE_FLAG(std::vector<std::string>, set);

namespace gcomp::cluster {

// LoadClusterConfig(--config, --set): its errors, NotFound naming the path included.
absl::StatusOr<proto::ClusterConfig> LoadClusterConfigFromFlags();

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_CONFIG_FLAGS_H_
