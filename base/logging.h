// One place that owns logging: a thin layer over spdlog so that the rest of the code
// names neither spdlog nor fmt directly and every binary logs in the same format.
//
//   gcomp::log::Info("shard {} listening on {}", shard, address);
//
// Thread-safe (spdlog's default logger is). Call InitLogging() once in main().
#ifndef GCOMP_BASE_LOGGING_H_
#define GCOMP_BASE_LOGGING_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"

namespace gcomp {

// Sets the level ("trace", "debug", "info", "warn", "error", "off") and a pattern with
// time, level and `program` on every line, written to stderr. Returns InvalidArgument
// naming the level when it is not one of the above.
absl::Status InitLogging(absl::string_view program, absl::string_view level = "info");

namespace log {

template <typename... Args>
void Debug(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::debug(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void Info(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::info(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void Warn(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::warn(fmt, std::forward<Args>(args)...);
}
template <typename... Args>
void Error(spdlog::format_string_t<Args...> fmt, Args&&... args) {
  spdlog::error(fmt, std::forward<Args>(args)...);
}

}  // namespace log
}  // namespace gcomp

#endif  // GCOMP_BASE_LOGGING_H_
