#include "base/logging.h"

#include <time.h>

#include <chrono>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "base/json.h"
#include "base/utf8.h"
#include "spdlog/pattern_formatter.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/sinks/stdout_sinks.h"

namespace gcomp {
namespace {

absl::string_view LevelName(spdlog::level::level_enum level) {
  switch (level) {
    case spdlog::level::trace: return "trace";
    case spdlog::level::debug: return "debug";
    case spdlog::level::info: return "info";
    case spdlog::level::warn: return "warn";
    case spdlog::level::err: return "error";
    case spdlog::level::critical: return "critical";
    default: return "off";
  }
}

// One JSON object per message. A formatter, not a pattern: a pattern cannot escape the
// message, so a quote or newline in it would break the line for the collector.
class JsonFormatter final : public spdlog::formatter {
 public:
  explicit JsonFormatter(std::string process) : process_(JsonQuote(process)) {}

  void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
    const auto since_epoch = msg.time.time_since_epoch();
    const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(since_epoch);
    const int millis = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch - seconds).count());
    const time_t t = static_cast<time_t>(seconds.count());
    struct tm utc;
    gmtime_r(&t, &utc);
    std::string line = absl::StrFormat(
        "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",\"level\":\"%s\",\"process\":%s,\"msg\":",
        utc.tm_year + 1900, utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
        millis, LevelName(msg.level), process_);
    AppendJsonString(absl::string_view(msg.payload.data(), msg.payload.size()), &line);
    line.append("}\n");
    dest.append(line.data(), line.data() + line.size());
  }

  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::unique_ptr<spdlog::formatter>(new JsonFormatter(*this));
  }

 private:
  JsonFormatter(const JsonFormatter&) = default;
  const std::string process_;  // already quoted
};

// The text format's message (flag %*): hidden controls escaped (EscapeForText), so that a
// tensor key or worker name sent by a peer cannot end the line and forge one of its own,
// nor put terminal commands, NULs or direction overrides in the log. Other text is kept.
class EscapedMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    dest.append(EscapeForText(absl::string_view(msg.payload.data(), msg.payload.size())));
  }
  std::unique_ptr<spdlog::custom_flag_formatter> clone() const override {
    return std::make_unique<EscapedMessage>();
  }
};

}  // namespace

absl::Status InitLogging(absl::string_view program, absl::string_view level,
                         absl::string_view format) {
  const spdlog::level::level_enum parsed =
      spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; only the literal "off" may mean that.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level '", level,
        "' is not one of trace, debug, info, warn, error, off"));
  }
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("log format '", format, "' is not one of text, json"));
  }
  const std::string name(program);
  spdlog::drop(name);  // a second call replaces the logger instead of throwing
  std::shared_ptr<spdlog::logger> logger;
  if (format == "json") {
    // No colour codes: they would land inside the collector's lines.
    logger = spdlog::stderr_logger_mt(name);
    logger->set_formatter(std::make_unique<JsonFormatter>(name));
  } else {
    logger = spdlog::stderr_color_mt(name);
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    formatter->add_flag<EscapedMessage>('*').set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n] %*");
    logger->set_formatter(std::move(formatter));
  }
  logger->set_level(parsed);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

namespace log {

std::string Clip(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return std::string(text);
  return absl::StrCat(Utf8Prefix(text, max_bytes), "... (", text.size(), " bytes)");
}

bool LineBudget::Admit() {
  int64_t dropped = 0;
  bool admit = false;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    if (now - window_start_ >= absl::Seconds(1)) {
      dropped = dropped_;
      dropped_ = 0;
      lines_ = 0;
      window_start_ = now;
    }
    admit = lines_ < lines_per_second_;
    if (admit) {
      ++lines_;
    } else {
      ++dropped_;
    }
  }
  if (dropped > 0) Warn("{} more {} not logged", dropped, what_);
  return admit;
}

}  // namespace log
}  // namespace gcomp
