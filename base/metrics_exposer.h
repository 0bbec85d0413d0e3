// Serves a prometheus-cpp registry in Prometheus text format on http://ADDRESS/metrics,
// for every gcomp process that exports metrics (shards, workers, the Python client).
//
//   absl::StatusOr<std::unique_ptr<MetricsExposer>> e = MetricsExposer::Start("0.0.0.0:9464", registry);
//
// prometheus-cpp reports a port it cannot bind by throwing; Start turns that into
// Unavailable naming the address, so no exception crosses this boundary.
#ifndef GCOMP_BASE_METRICS_EXPOSER_H_
#define GCOMP_BASE_METRICS_EXPOSER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace prometheus {
class Exposer;
class Collectable;
}  // namespace prometheus

namespace gcomp {

class MetricsExposer {
 public:
  // `address` is "host:port" (port 0 picks a free one, see port()). `metrics` (a
  // prometheus::Registry, or any Collectable) is shared: the exposer keeps it alive.
  static absl::StatusOr<std::unique_ptr<MetricsExposer>> Start(
      const std::string& address, std::shared_ptr<prometheus::Collectable> metrics);
  ~MetricsExposer();
  MetricsExposer(const MetricsExposer&) = delete;
  MetricsExposer& operator=(const MetricsExposer&) = delete;

  int port() const { return port_; }

 private:
  MetricsExposer() = default;
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace gcomp

#endif  // GCOMP_BASE_METRICS_EXPOSER_H_
