#include "base/metrics_exposer.h"

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/testing/http_get.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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

// Connections that send half a request and wait (no credentials needed) held both of
// civetweb's default threads for its 30 s read timeout, and every scrape waited for them.
TEST(MetricsExposer, HalfSentRequestsDoNotBlockScrapes) {
  auto registry = std::make_shared<prometheus::Registry>();
  absl::StatusOr<std::unique_ptr<MetricsExposer>> e =
      MetricsExposer::Start("127.0.0.1:0", registry);
  ASSERT_TRUE(e.ok()) << e.status();
  std::vector<int> slow;
  for (int i = 0; i < 7; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons((*e)->port());
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    const std::string half = "GET /metrics HTTP/1.1\r\nHost: x\r\n";
    ASSERT_EQ(send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
    slow.push_back(fd);
  }
  std::future<std::string> scrape =
      std::async(std::launch::async, [&] { return testing::HttpGet((*e)->port()); });
  ASSERT_EQ(scrape.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "a scrape waited on connections that never finish their request";
  EXPECT_THAT(scrape.get(), HasSubstr("200 OK"));
  for (int fd : slow) close(fd);
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
