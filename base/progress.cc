#include "base/progress.h"

#include <unistd.h>

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gcomp {

absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text) {
  if (text == "auto") return ProgressMode::kAuto;
  if (text == "always") return ProgressMode::kAlways;
  if (text == "never") return ProgressMode::kNever;
  return absl::InvalidArgumentError(
      absl::StrCat("progress mode '", text, "' is not one of auto, always, never"));
}

bool ProgressEnabled(ProgressMode mode, int fd) {
  switch (mode) {
    case ProgressMode::kAlways: return true;
    case ProgressMode::kNever: return false;
    case ProgressMode::kAuto: return isatty(fd) == 1;
  }
  return false;
}

std::string FormatEta(absl::Duration d) {
  if (d < absl::ZeroDuration() || d == absl::InfiniteDuration()) return "?";
  const int64_t s = absl::ToInt64Seconds(absl::Ceil(d, absl::Seconds(1)));
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

ProgressMeter::ProgressMeter(int64_t total_steps, absl::Time start, ProgressOptions options)
    : total_steps_(total_steps > 0 ? total_steps : 0), options_(options), rate_time_(start) {}

std::optional<std::string> ProgressMeter::Update(int64_t steps_done, uint64_t raw_bytes,
                                                 uint64_t wire_bytes, absl::Time now) {
  steps_done_ = steps_done;
  raw_bytes_ = raw_bytes;
  wire_bytes_ = wire_bytes;
  const bool last = total_steps_ > 0 && steps_done >= total_steps_;
  if (!last && last_shown_.has_value() && now - *last_shown_ < options_.min_interval) {
    return std::nullopt;
  }
  const double seconds = absl::ToDoubleSeconds(now - rate_time_);
  if (rate_steps_ == 0 && steps_done == 1) {
    // Step 1 carries the warm-up (connections, declarations, first allocations) and can
    // take many times a later step: the rate starts after it.
    rate_steps_ = 1;
    rate_time_ = now;
  } else if (seconds > 0 && steps_done > rate_steps_) {
    const double interval_rate = (steps_done - rate_steps_) / seconds;
    rate_ = rate_ == 0 ? interval_rate
                       : options_.smoothing * interval_rate + (1 - options_.smoothing) * rate_;
    rate_steps_ = steps_done;
    rate_time_ = now;
  }
  last_shown_ = now;
  return Line();
}

std::string ProgressMeter::Line() const {
  std::string line = absl::StrCat("step ", steps_done_);
  if (total_steps_ > 0) absl::StrAppend(&line, "/", total_steps_);
  absl::StrAppend(&line, rate_ > 0 ? absl::StrFormat("  %.1f steps/s", rate_)
                                   : std::string("  - steps/s"));
  if (wire_bytes_ > 0) {
    absl::StrAppend(&line, absl::StrFormat("  ratio %.2fx", double(raw_bytes_) / double(wire_bytes_)));
  }
  if (total_steps_ > 0) {
    const int64_t left = std::max<int64_t>(0, total_steps_ - steps_done_);
    absl::Duration eta = absl::InfiniteDuration();
    if (left == 0) {
      eta = absl::ZeroDuration();
    } else if (rate_ > 0) {
      eta = absl::Seconds(left / rate_);
    }
    absl::StrAppend(&line, "  ETA ", FormatEta(eta));
  }
  return line;
}

void ProgressPrinter::Show(const std::string& line) {
  if (!enabled_) return;
  std::string text = absl::StrCat("\r", line);
  if (line.size() < last_length_) text.append(last_length_ - line.size(), ' ');
  last_length_ = line.size();
  std::fputs(text.c_str(), out_);
  std::fflush(out_);
  shown_ = true;
}

void ProgressPrinter::Finish(const std::string& line) {
  if (!enabled_) return;
  if (!line.empty()) Show(line);
  if (shown_) {
    std::fputs("\n", out_);
    std::fflush(out_);
  }
  shown_ = false;
  last_length_ = 0;
}

}  // namespace gcomp
