// gcomp_build_info{version="0.1.0",revision="5c50a0b1d2e3"} 1: the Prometheus convention
// for a program's build, joined onto its other series by dashboards and alerts.
#ifndef GCOMP_BASE_BUILD_INFO_METRIC_H_
#define GCOMP_BASE_BUILD_INFO_METRIC_H_

namespace prometheus {
class Registry;
}  // namespace prometheus

namespace gcomp {

// Adds the gauge to `registry` (once per registry: a second call is a programmer error).
void RegisterBuildInfo(prometheus::Registry& registry);

}  // namespace gcomp

#endif  // GCOMP_BASE_BUILD_INFO_METRIC_H_
