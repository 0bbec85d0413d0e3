// A worker's Prometheus metrics, served on ClientOptions::metrics_address: the client's
// byte and call counters (read from ClientStats when scraped, so the hot path pays
// nothing for them) and a histogram of push-pull latencies. Const labels gcomp_job and worker.
// Thread-safe.
#ifndef GCOMP_WORKER_CLIENT_METRICS_H_
#define GCOMP_WORKER_CLIENT_METRICS_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/histogram.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "worker/client.h"

namespace gcomp::worker {

class ClientMetrics final : public prometheus::Collectable {
 public:
  // `stats` is called at every scrape; it must stay callable while this object lives.
  ClientMetrics(const std::string& job, uint32_t worker, std::function<ClientStats()> stats);

  // One PushPull (a whole tensor, all its chunks) took `seconds`.
  void ObservePushPull(double seconds);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::map<std::string, std::string> labels_;  // constant after construction
  const std::function<ClientStats()> stats_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Histogram* push_pull_seconds_;  // owned by registry_
};

}  // namespace gcomp::worker

#endif  // GCOMP_WORKER_CLIENT_METRICS_H_
