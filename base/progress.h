// The progress line of long runs (gcomp_worker, the local launcher):
//
//   step 1234/10000  56.7 steps/s  ratio 4.21x  ETA 2m35s
//
// rewritten in place with '\r' on a terminal, and nothing at all when the output is not one
// (a log file must not fill with carriage returns). The meter does the arithmetic on times
// the caller passes in, so it is tested with fixed times; the printer only writes.
//
//   ProgressMeter meter(steps, absl::Now());
//   ProgressPrinter printer(stderr, ProgressEnabled(mode, STDERR_FILENO));
//   ... each step: if (auto line = meter.Update(done, raw, wire, absl::Now())) printer.Show(*line);
//   printer.Finish(meter.Line(absl::Now()));
//
// Thread-compatible: one thread updates a meter and a printer.
#ifndef GCOMP_BASE_PROGRESS_H_
#define GCOMP_BASE_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace gcomp {

// --progress=auto|always|never: auto shows the line only when the output is a terminal.
enum class ProgressMode { kAuto, kAlways, kNever };

// InvalidArgument naming `text` unless it is auto, always or never.
absl::StatusOr<ProgressMode> ParseProgressMode(absl::string_view text);

// Whether to show progress on file descriptor `fd` (auto: isatty(fd)).
bool ProgressEnabled(ProgressMode mode, int fd);

// "45s", "2m35s", "1h02m", "3d04h"; "?" for a negative or infinite duration. Whole seconds,
// rounded up so that a nearly finished run never reads "0s" early.
std::string FormatEta(absl::Duration d);

struct ProgressOptions {
  // Update() returns a line at most this often (the last step always gets one).
  absl::Duration min_interval = absl::Milliseconds(500);
  // Weight of the newest interval in the smoothed steps/s (1 = no smoothing): the rate
  // follows a run that speeds up or slows down within a few lines without jumping about.
  double smoothing = 0.3;
};

class ProgressMeter {
 public:
  // `total_steps` 0 means unknown (no "/total" and no ETA). `start` is when step 0 began.
  // When step 1 is seen on its own, the rate is measured from its end (it carries the
  // warm-up), so the line after it shows "- steps/s" and "ETA ?".
  ProgressMeter(int64_t total_steps, absl::Time start, ProgressOptions options = {});

  // Records that `steps_done` steps have finished at `now`, having moved `raw_bytes`
  // (tensor bytes as if uncompressed) as `wire_bytes` (what went over the network); both
  // cumulative, 0 wire bytes meaning no ratio. Returns the line when it is time to show
  // one (min_interval since the last, or the last step), else nothing. `now` must not go
  // backwards.
  std::optional<std::string> Update(int64_t steps_done, uint64_t raw_bytes, uint64_t wire_bytes,
                                    absl::Time now);

  // The line for the latest Update (forced; e.g. for the final one).
  std::string Line() const;

  double steps_per_second() const { return rate_; }

 private:
  const int64_t total_steps_;
  const ProgressOptions options_;
  int64_t steps_done_ = 0;
  uint64_t raw_bytes_ = 0;
  uint64_t wire_bytes_ = 0;
  double rate_ = 0;            // smoothed steps/s; 0 until the first interval
  int64_t rate_steps_ = 0;     // steps_done_ when rate_ was last updated
  absl::Time rate_time_;       // and when
  std::optional<absl::Time> last_shown_;
};

// Writes progress lines over each other on `out` ('\r', padded to blank out a longer
// previous line) when enabled; does nothing when not. `out` is borrowed and must outlive
// the printer.
class ProgressPrinter {
 public:
  ProgressPrinter(FILE* out, bool enabled) : out_(out), enabled_(enabled) {}
  ProgressPrinter(const ProgressPrinter&) = delete;
  ProgressPrinter& operator=(const ProgressPrinter&) = delete;

  void Show(const std::string& line);
  // Shows `line` (if not empty) and ends it with a newline, so later output starts clean.
  void Finish(const std::string& line = "");
  bool enabled() const { return enabled_; }

 private:
  FILE* const out_;
  const bool enabled_;
  size_t last_length_ = 0;
  bool shown_ = false;
};

}  // namespace gcomp

#endif  // GCOMP_BASE_PROGRESS_H_
