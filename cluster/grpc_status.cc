#include "cluster/grpc_status.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/utf8.h"
#include "proto/status.pb.h"

namespace gcomp::cluster {

namespace {

// absl's payload key for the retry detail, and the type URL it travels under.
constexpr char kRetryTypeUrl[] = "type.googleapis.com/google.rpc.RetryInfo";

}  // namespace

absl::Status BusyRefusal(absl::string_view message, absl::Duration retry_after) {
  absl::Status s = absl::ResourceExhaustedError(message);
  proto::RetryInfo info;
  const int64_t ns = absl::ToInt64Nanoseconds(retry_after);
  info.mutable_retry_delay()->set_seconds(ns / 1000000000);
  info.mutable_retry_delay()->set_nanos(static_cast<int32_t>(ns % 1000000000));
  s.SetPayload(kRetryTypeUrl, absl::Cord(info.SerializeAsString()));
  return s;
}

bool IsBusyRefusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kResourceExhausted &&
         status.GetPayload(kRetryTypeUrl).has_value();
}

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
  const auto code = static_cast<grpc::StatusCode>(status.code());
  const auto retry = status.GetPayload(kRetryTypeUrl);
  if (!retry.has_value()) return grpc::Status(code, std::move(sent));
  proto::RpcStatus details;
  details.set_code(static_cast<int32_t>(code));
  details.set_message(sent);
  google::protobuf::Any* any = details.add_details();
  any->set_type_url(kRetryTypeUrl);
  any->set_value(std::string(*retry));
  return grpc::Status(code, std::move(sent), details.SerializeAsString());
}

absl::Status FromGrpc(const grpc::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  absl::Status s(static_cast<absl::StatusCode>(status.error_code()),
                 context.empty() ? status.error_message()
                                 : absl::StrCat(context, ": ", status.error_message()));
  // The retry detail survives the hop (a shard passing a peer's refusal on, a client).
  proto::RpcStatus details;
  if (!status.error_details().empty() && details.ParseFromString(status.error_details())) {
    for (const google::protobuf::Any& any : details.details()) {
      if (any.type_url() == kRetryTypeUrl) s.SetPayload(kRetryTypeUrl, absl::Cord(any.value()));
    }
  }
  return s;
}

bool IsBusyRefusal(const grpc::Status& status) {
  if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) return false;
  return IsBusyRefusal(FromGrpc(status)) ||
         absl::StrContains(status.error_message(), "Server Threadpool Exhausted");
}

}  // namespace gcomp::cluster
