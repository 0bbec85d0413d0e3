// absl::Status <-> grpc::Status, the one place where both sides of the wire convert. The
// numeric codes of the two are the same by design (both follow google.rpc.Code), so the
// code passes through and the message is kept.
#ifndef GCOMP_CLUSTER_GRPC_STATUS_H_
#define GCOMP_CLUSTER_GRPC_STATUS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"

namespace gcomp::cluster {

// The longest message a handler sends, in bytes. gRPC sends it percent-encoded in the
// trailers, each byte outside printable ASCII as three, and a client refuses trailers over
// 8 KiB (its default) with RESOURCE_EXHAUSTED, losing the code and the reason.
inline constexpr size_t kMaxStatusMessageBytes = 2000;

// What a gRPC handler returns for `status`: the code, and the message cut to
// kMaxStatusMessageBytes (at a UTF-8 character boundary) with a note of what was cut.
grpc::Status ToGrpc(const absl::Status& status);

// What a client makes of a call's status; a non-empty `context` (the call and the peer)
// is put before the message: "PushPull to shard 1 (10.0.0.2:7070): ...".
absl::Status FromGrpc(const grpc::Status& status, absl::string_view context = "");

// A refusal that passes as calls end (the shard is busy, not full): one of its bounds on
// calls in flight (per connection, per worker id, calls waiting for an epoch), or an
// address refused for a while for replies it left unread. RESOURCE_EXHAUSTED with
// `message`, marked retryable by a detail (proto/status.proto RetryInfo, about
// `retry_after`) that ToGrpc sends in the status details and IsBusyRefusal reads back;
// a memory budget or a tensor count is refused without it, since those do not pass.
absl::Status BusyRefusal(absl::string_view message,
                         absl::Duration retry_after = absl::Milliseconds(100));

// Whether a refusal is a busy one that callers retry after a backoff: RESOURCE_EXHAUSTED
// with the retry detail, or gRPC's own refusal when every request thread is taken (made
// inside gRPC, so its message is the only sign).
bool IsBusyRefusal(const grpc::Status& status);
bool IsBusyRefusal(const absl::Status& status);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_GRPC_STATUS_H_
