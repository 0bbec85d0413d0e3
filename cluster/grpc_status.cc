#include "cluster/grpc_status.h"

#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/utf8.h"

namespace gcomp::cluster {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const absl::string_view message = status.message();
  std::string sent;
  if (message.size() <= kMaxStatusMessageBytes) {
    sent = std::string(message);
  } else {
    const absl::string_view kept = Utf8Prefix(message, kMaxStatusMessageBytes - 40);  // + note
    sent = absl::StrCat(kept, " [", message.size() - kept.size(), " more bytes cut]");
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::move(sent));
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      context.empty() ? status.error_message()
                                      : absl::StrCat(context, ": ", status.error_message()));
}

bool IsBusyRefusal(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return false;
  const std::string& m = status.error_message();
  return absl::StrContains(m, "calls in flight on this shard") ||
         absl::StrContains(m, "(replies unread)") || absl::StrContains(m, "Threadpool Exhausted");
}

}  // namespace gcomp::cluster
