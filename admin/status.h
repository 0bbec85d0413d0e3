// `gcomp_admin status`: asks every shard of a cluster config for its Stats, all shards at
// once with a deadline each, and renders one row per shard as an aligned table or JSON.
//
//   absl::StatusOr<ClusterStatus> s = CollectStatus(config, {.timeout_ms = 3000});
//   std::cout << FormatStatusTable(*s);    // or FormatStatusJson(*s)
//   return s->all_up() ? 0 : 1;
//
// Shards are dialled with the config's security (mutual TLS or plaintext, and the job
// token: cluster/credentials.h), so a shard that refuses the caller shows as down with
// UNAUTHENTICATED or PERMISSION_DENIED. Thread-compatible free functions.
#ifndef GCOMP_ADMIN_STATUS_H_
#define GCOMP_ADMIN_STATUS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/aggregation.pb.h"
#include "proto/cluster_config.pb.h"

namespace gcomp::admin {

struct StatusOptions {
  // Deadline of each shard's Stats call, connection included; shards are asked in
  // parallel, so the whole collection takes about this long at most.
  int64_t timeout_ms = 3000;
};

// One shard's row.
struct ShardStatus {
  uint32_t shard = 0;
  std::string address;
  // OK when the shard answered as the shard it is listed as; else why it is down: the gRPC
  // status of the call (UNAVAILABLE, DEADLINE_EXCEEDED, UNAUTHENTICATED, ...), or
  // FailedPrecondition when another shard index answered at that address.
  absl::Status error;
  proto::StatsResponse stats;  // meaningful only when up()

  bool up() const { return error.ok(); }
};

struct ClusterStatus {
  std::vector<ShardStatus> shards;  // in config order

  bool all_up() const;
};

// InvalidArgument for an invalid config, or the credentials' error (NotFound or
// FailedPrecondition naming the security field) when they cannot be built; a shard that
// does not answer is not an error here but a row that is down.
absl::StatusOr<ClusterStatus> CollectStatus(const proto::ClusterConfig& config,
                                            const StatusOptions& options);

// Aligned columns, one line per shard after a header:
//   shard address state epoch chunks tensors steps failed in out ratio memory last_error
// Bytes in human units (KiB, MiB, GiB), ratio as "4.21x" (raw over wire bytes, both
// directions), memory as "used/budget". The state is "up", or "degraded" when the shard's map
// has shards down after a failover (replicas >= 2). A down shard reads DOWN and its status code and
// message in the last column.
std::string FormatStatusTable(const ClusterStatus& status);

// One JSON object and a newline: {"shards":[{...}, ...], "all_up": bool}. Every row has
// shard, address, up; an up row has every Stats number (plus ratio, a number, 0 when
// nothing moved) and last_error; a down row has error_code (e.g. "UNAVAILABLE") and error.
std::string FormatStatusJson(const ClusterStatus& status);

// "0 B", "512 B", "1.5 KiB", "12.3 MiB", "4.0 GiB", "1.2 TiB".
std::string HumanBytes(uint64_t bytes);

}  // namespace gcomp::admin

#endif  // GCOMP_ADMIN_STATUS_H_
