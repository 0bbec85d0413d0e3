#include "worker/client_metrics.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace gcomp::worker {
namespace {

prometheus::ClientMetric Counter(const std::map<std::string, std::string>& labels,
                                 std::vector<std::pair<std::string, std::string>> extra,
                                 double value) {
  prometheus::ClientMetric m;
  for (const auto& [k, v] : labels) m.label.push_back({k, v});
  for (auto& [k, v] : extra) m.label.push_back({std::move(k), std::move(v)});
  m.counter.value = value;
  return m;
}

}  // namespace

ClientMetrics::ClientMetrics(const std::string& job, uint32_t worker,
                             std::function<ClientStats()> stats)
    : labels_{{"gcomp_job", job}, {"worker", absl::StrCat(worker)}},
      stats_(std::move(stats)),
      registry_(std::make_shared<prometheus::Registry>()) {
  std::vector<double> buckets;
  for (double v = 1e-4; v < 120; v *= 2) buckets.push_back(v);
  push_pull_seconds_ = &prometheus::BuildHistogram()
                            .Name("gcomp_worker_push_pull_seconds")
                            .Help("One tensor's push-pull: all its chunks sent and answered.")
                            .Labels(labels_)
                            .Register(*registry_)
                            .Add({}, buckets);
}

void ClientMetrics::ObservePushPull(double seconds) { push_pull_seconds_->Observe(seconds); }

std::vector<prometheus::MetricFamily> ClientMetrics::Collect() const {
  const ClientStats s = stats_();
  auto family = [](std::string name, std::string help) {
    prometheus::MetricFamily f;
    f.name = std::move(name);
    f.help = std::move(help);
    f.type = prometheus::MetricType::Counter;
    return f;
  };
  std::vector<prometheus::MetricFamily> out = registry_->Collect();
  prometheus::MetricFamily raw = family("gcomp_worker_raw_bytes_total",
                                        "Tensor bytes pushed (sent) and received, as if uncompressed.");
  raw.metric.push_back(Counter(labels_, {{"direction", "sent"}}, s.raw_bytes_sent));
  raw.metric.push_back(Counter(labels_, {{"direction", "received"}}, s.raw_bytes_received));
  prometheus::MetricFamily wire =
      family("gcomp_worker_wire_bytes_total", "Encoded block bytes sent and received.");
  wire.metric.push_back(Counter(labels_, {{"direction", "sent"}}, s.wire_bytes_sent));
  wire.metric.push_back(Counter(labels_, {{"direction", "received"}}, s.wire_bytes_received));
  prometheus::MetricFamily chunks = family("gcomp_worker_chunks_total", "Chunks pushed.");
  chunks.metric.push_back(Counter(labels_, {}, s.chunks));
  prometheus::MetricFamily retries =
      family("gcomp_worker_retries_total", "Calls retried after UNAVAILABLE or CANCELLED.");
  retries.metric.push_back(Counter(labels_, {}, s.retries));
  for (auto* f : {&raw, &wire, &chunks, &retries}) out.push_back(std::move(*f));
  return out;
}

}  // namespace gcomp::worker
