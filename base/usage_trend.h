// Growth of a process's resident memory and open files over a soak run, from samples taken
// at a fixed interval. A single sample lands anywhere in a training step (buffers of the
// step in flight, heap pages not yet trimmed), so two single samples differ by several
// MiB of jitter; a leak is a change of level. The level is the median of a window of
// samples at each end of the run, and the growth is the change of that level.
#ifndef GCOMP_BASE_USAGE_TREND_H_
#define GCOMP_BASE_USAGE_TREND_H_

#include <cstddef>

#include "absl/types/span.h"
#include "base/process_usage.h"

namespace gcomp {

struct UsageTrendOptions {
  // Each window holds this fraction of the samples, and at least min_window_samples
  // (but never more than half of them).
  double window_fraction = 0.1;
  size_t min_window_samples = 20;
};

struct UsageTrend {
  size_t samples = 0;
  size_t window = 0;               // samples per end window
  ProcessUsage first, last;        // single samples at both ends, for reference
  ProcessUsage first_median, last_median;
  ProcessUsage first_max, last_max;  // peaks of the windows
  double rss_growth_pct = 0;       // of the medians: the figure the soak check judges
  double fd_growth_pct = 0;        // of the medians
  double rss_peak_growth_pct = 0;  // of the window peaks
};

// With fewer than two samples every figure is zero (`samples` says how many there were).
UsageTrend MeasureUsageTrend(absl::Span<const ProcessUsage> samples,
                             const UsageTrendOptions& options = {});

}  // namespace gcomp

#endif  // GCOMP_BASE_USAGE_TREND_H_
