#include "base/metrics_exposer.h"

#include <string>

#include "absl/strings/str_cat.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "base/testing/http_get.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace gcomp {
namespace {

using ::testing::HasSubstr;

// A plain HTTP GET of /metrics on 127.0.0.1:port.

TEST(MetricsExposer, ServesTheRegistryAsText) {
  auto registry = std::make_shared<prometheus::Registry>();
  prometheus::BuildCounter().Name("gcomp_test_things_total").Help("things").Register(*registry)
      .Add({{"kind", "a"}})
      .Increment(3);
  absl::StatusOr<std::unique_ptr<MetricsExposer>> e =
      MetricsExposer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_GT((*e)->port(), 0);
  const std::string text = testing::HttpGet((*e)->port());
  EXPECT_THAT(text, HasSubstr("200 OK"));
  EXPECT_THAT(text, HasSubstr("gcomp_test_things_total{kind=\"a\"} 3"));
}

TEST(MetricsExposer, BusyPortIsUnavailableNotAnException) {
  auto registry = std::make_shared<prometheus::Registry>();
  auto first = MetricsExposer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(first.ok());
  auto second = MetricsExposer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), registry);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("cannot serve metrics on"));
}

}  // namespace
}  // namespace gcomp
