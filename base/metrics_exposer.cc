#include "base/metrics_exposer.h"

#include <exception>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/exposer.h"
#include "prometheus/collectable.h"

namespace gcomp {

absl::StatusOr<std::unique_ptr<MetricsExposer>> MetricsExposer::Start(
    const std::string& address, std::shared_ptr<prometheus::Collectable> metrics) {
  std::unique_ptr<MetricsExposer> e(new MetricsExposer());
  e->metrics_ = std::move(metrics);
  try {  // civetweb's listen failure arrives as an exception; it stops here.
    // civetweb's defaults (2 threads, 30 s to read a request) let two connections that
    // send half a request and wait block every scrape for 30 s at a time; each thread serves
    // one connection until its request is read or the timeout passes, so a burst of N
    // silent connections holds scrapes back N * timeout / threads. Scrapes are small, sent
    // at once and quick: 16 threads and 1 s (200 silent connections: 12.5 s, not 75 s).
    e->exposer_ = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", address, "num_threads", "16", "request_timeout_ms", "1000"});
  } catch (const std::exception& ex) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", address, ": ", ex.what()));
  }
  e->exposer_->RegisterCollectable(e->metrics_);
  const std::vector<int> ports = e->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address));
  }
  e->port_ = ports.front();
  return e;
}

MetricsExposer::~MetricsExposer() = default;

}  // namespace gcomp
