// One place that owns logging: a thin layer over spdlog so that the rest of the code
// names neither spdlog nor fmt directly and every binary logs in the same format.
//
//   gcomp::log::Info("shard {} listening on {}", shard, address);
//
// Thread-safe (spdlog's default logger is). Call InitLogging() once in main().
#ifndef GCOMP_BASE_LOGGING_H_
#define GCOMP_BASE_LOGGING_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

namespace gcomp {

// Sets the level ("trace", "debug", "info", "warn", "error", "off") and the line format,
// written to stderr:
//   "text": 2026-12-03T08:10:00.123 I gcomp_server[0]] message   (local time)
//   "json": one object per line for log collectors, time in UTC:
//           {"ts":"2026-12-03T08:10:00.123Z","level":"info","process":"gcomp_server[0]","msg":"..."}
//           (level is one of trace, debug, info, warn, error, critical; strings escaped per
//           RFC 8259, invalid UTF-8 replaced, so every line parses).
// May be called again before other threads log (the later call wins). Returns InvalidArgument naming the level or
// format when it is not one of the above.
absl::Status InitLogging(absl::string_view program, absl::string_view level = "info",
                         absl::string_view format = "text");

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

// At most `lines_per_second` lines a second for one kind of event that a network peer can
// cause at will (refused calls, rejected pushes), so that a client repeating it cannot
// flood the log; when a second ends with lines dropped, the next admitted one is preceded
// by "<N> more <what> not logged". Thread-safe.
//
//   static log::LineBudget* const budget = new log::LineBudget(10, "rejected pushes");
//   if (budget->Admit()) log::Warn("rejected push ...");
// `text` from a network peer (a reason, a name) cut to at most `max_bytes` for a log line
// or a message, at a UTF-8 character boundary, with the full length said:
// "<first bytes>... (N bytes)".
std::string Clip(absl::string_view text, size_t max_bytes = 200);

class LineBudget {
 public:
  LineBudget(int lines_per_second, std::string what)
      : lines_per_second_(lines_per_second), what_(std::move(what)) {}
  LineBudget(const LineBudget&) = delete;
  LineBudget& operator=(const LineBudget&) = delete;

  // Whether to log this event's line; counts it as dropped when not.
  bool Admit();

 private:
  const int lines_per_second_;
  const std::string what_;
  absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_);
  int lines_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace log
}  // namespace gcomp

#endif  // GCOMP_BASE_LOGGING_H_
