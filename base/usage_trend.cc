#include "base/usage_trend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace gcomp {
namespace {

double GrowthPct(double from, double to) { return from == 0 ? 0.0 : (to - from) * 100.0 / from; }

// Median and maximum of one field over samples [begin, begin + count).
template <typename Field>
void Window(absl::Span<const ProcessUsage> s, size_t begin, size_t count, Field field,
            uint64_t* median, uint64_t* max) {
  std::vector<uint64_t> v;
  v.reserve(count);
  for (size_t i = begin; i < begin + count; ++i) v.push_back(field(s[i]));
  std::sort(v.begin(), v.end());
  *median = v[v.size() / 2];
  *max = v.back();
}

}  // namespace

UsageTrend MeasureUsageTrend(absl::Span<const ProcessUsage> samples,
                             const UsageTrendOptions& options) {
  UsageTrend t;
  t.samples = samples.size();
  if (samples.size() < 2) return t;
  const size_t n = samples.size();
  size_t w = std::max(options.min_window_samples,
                      static_cast<size_t>(std::llround(options.window_fraction * n)));
  w = std::max<size_t>(1, std::min(w, n / 2));
  t.window = w;
  t.first = samples.front();
  t.last = samples.back();
  auto rss = [](const ProcessUsage& u) { return u.rss_bytes; };
  auto fds = [](const ProcessUsage& u) { return u.open_fds; };
  Window(samples, 0, w, rss, &t.first_median.rss_bytes, &t.first_max.rss_bytes);
  Window(samples, n - w, w, rss, &t.last_median.rss_bytes, &t.last_max.rss_bytes);
  Window(samples, 0, w, fds, &t.first_median.open_fds, &t.first_max.open_fds);
  Window(samples, n - w, w, fds, &t.last_median.open_fds, &t.last_max.open_fds);
  t.rss_growth_pct = GrowthPct(t.first_median.rss_bytes, t.last_median.rss_bytes);
  t.fd_growth_pct = GrowthPct(t.first_median.open_fds, t.last_median.open_fds);
  t.rss_peak_growth_pct = GrowthPct(t.first_max.rss_bytes, t.last_max.rss_bytes);
  return t;
}

}  // namespace gcomp
