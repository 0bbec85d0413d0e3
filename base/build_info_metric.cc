#include "base/build_info_metric.h"

#include <string>

#include "base/build_info.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace gcomp {

void RegisterBuildInfo(prometheus::Registry& registry) {
  const BuildInfo info = GetBuildInfo();
  prometheus::BuildGauge()
      .Name("gcomp_build_info")
      .Help("Always 1; its labels name the release and the git revision of this program.")
      .Register(registry)
      .Add({{"version", std::string(info.version)}, {"revision", std::string(info.revision)}})
      .Set(1);
}

}  // namespace gcomp
