// absl::Status <-> grpc::Status, the one place where both sides of the wire convert. The
// numeric codes of the two are the same by design (both follow google.rpc.Code), so the
// code passes through and the message is kept.
#ifndef GCOMP_CLUSTER_GRPC_STATUS_H_
#define GCOMP_CLUSTER_GRPC_STATUS_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
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

// Whether a RESOURCE_EXHAUSTED refusal is the shard being busy rather than full: one of its
// bounds on calls in flight (per connection, per worker id, calls waiting for an epoch), an
// address refused for a while for replies it left unread, or gRPC's own when every request
// thread is taken. Those pass as calls end, so callers retry
// them after a backoff; a memory budget or tensor count does not pass.
bool IsBusyRefusal(const grpc::Status& status);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_GRPC_STATUS_H_
