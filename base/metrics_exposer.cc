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
    e->exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
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
