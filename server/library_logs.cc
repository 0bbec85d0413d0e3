#include "server/library_logs.h"

#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "base/logging.h"
#include "google/protobuf/stubs/logging.h"
#include "grpc/support/log.h"

namespace gcomp::server {
namespace {

void ProtobufLogHandler(google::protobuf::LogLevel level, const char* filename, int line,
                        const std::string& message) {
  static log::LineBudget* const budget =
      new log::LineBudget(kProtobufLinesPerSecond, "protobuf library messages");
  if (level < google::protobuf::LOGLEVEL_WARNING || !budget->Admit()) return;
  log::Warn("protobuf ({}:{}): {}", filename, line, log::Clip(message, 1000));
}

void GrpcLogHandler(gpr_log_func_args* args) {
  static log::LineBudget* const budget =
      new log::LineBudget(kGrpcLinesPerSecond, "gRPC library messages");
  const absl::string_view message = args->message != nullptr ? args->message : "";
  if (!absl::StartsWith(message, "assertion failed") && !budget->Admit()) return;
  absl::string_view file = args->file != nullptr ? args->file : "";
  if (const size_t slash = file.rfind('/'); slash != absl::string_view::npos) {
    file.remove_prefix(slash + 1);
  }
  const std::string text = log::Clip(message, 1000);
  switch (args->severity) {
    case GPR_LOG_SEVERITY_DEBUG:
      log::Debug("grpc ({}:{}): {}", std::string(file), args->line, text);
      break;
    case GPR_LOG_SEVERITY_INFO:
      log::Info("grpc ({}:{}): {}", std::string(file), args->line, text);
      break;
    default:
      log::Error("grpc ({}:{}): {}", std::string(file), args->line, text);
  }
}

}  // namespace

void RouteLibraryLogs() {
  google::protobuf::SetLogHandler(&ProtobufLogHandler);
  gpr_set_log_function(&GrpcLogHandler);
}

}  // namespace gcomp::server
