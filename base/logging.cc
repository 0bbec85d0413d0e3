#include "base/logging.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "spdlog/sinks/stdout_color_sinks.h"

namespace gcomp {

absl::Status InitLogging(absl::string_view program, absl::string_view level) {
  const spdlog::level::level_enum parsed =
      spdlog::level::from_str(std::string(level));
  // from_str maps unknown names to "off"; only the literal "off" may mean that.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "log level '", level,
        "' is not one of trace, debug, info, warn, error, off"));
  }
  auto logger = spdlog::stderr_color_mt(std::string(program));
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n] %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(std::move(logger));
  return absl::OkStatus();
}

}  // namespace gcomp
