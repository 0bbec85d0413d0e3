#include "server/library_logs.h"

#include <algorithm>
#include <string>

#include "absl/time/clock.h"
#include "base/logging.h"
#include "base/testing/capture_stderr.h"
#include "google/protobuf/stubs/logging.h"
#include "grpc/grpc.h"
#include "grpc/support/log.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

size_t Lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// gRPC core sets the level it logs at (GRPC_VERBOSITY) when it starts.
class RouteLibraryLogs : public ::testing::Test {
 protected:
  void SetUp() override { grpc_init(); }
  void TearDown() override { grpc_shutdown(); }
};

// A peer that resets thousands of connections a second made gRPC core write a line for each
// straight to stderr (tens of MB in 10 s): now they take the process's format and budget.
TEST_F(RouteLibraryLogs, GrpcCoreLinesAreBudgetedAndInTheProcessFormat) {
  const std::string out = testing::CaptureStderr([] {
    ASSERT_TRUE(InitLogging("library_logs_test", "info", "json").ok());
    server::RouteLibraryLogs();
    for (int i = 0; i < 5000; ++i) {
      gpr_log(GPR_ERROR, "Failed getpeername: Transport endpoint is not connected %d", i);
    }
  });
  EXPECT_GE(Lines(out), 1u) << out;
  EXPECT_LE(Lines(out), 2u * kGrpcLinesPerSecond) << out;  // the loop may span two seconds
  EXPECT_NE(out.find("{\"ts\":"), std::string::npos) << out;
  EXPECT_NE(out.find("\"level\":\"error\""), std::string::npos) << out;
  EXPECT_NE(out.find("grpc (library_logs_test.cc:"), std::string::npos) << out;
  EXPECT_NE(out.find("Failed getpeername: Transport endpoint is not connected 0"),
            std::string::npos)
      << out;
}

TEST_F(RouteLibraryLogs, PeerTextInGrpcLinesIsEscaped) {
  const std::string out = testing::CaptureStderr([] {
    ASSERT_TRUE(InitLogging("library_logs_test", "info", "text").ok());
    server::RouteLibraryLogs();
    absl::SleepFor(absl::Milliseconds(1100));  // a new second of the budget
    gpr_log(GPR_ERROR, "peer said %s", "x\n2026-12-06T00:00:00.000 E forged\x1b[2J");
  });
  EXPECT_LE(Lines(out), 2u) << out;  // and perhaps a count of lines an earlier test dropped
  EXPECT_NE(out.find("peer said x\\n2026-12-06T00:00:00.000 E forged\\x1b[2J"), std::string::npos)
      << out;
}

TEST_F(RouteLibraryLogs, ProtobufLinesAreBudgeted) {
  const std::string out = testing::CaptureStderr([] {
    ASSERT_TRUE(InitLogging("library_logs_test", "info", "text").ok());
    server::RouteLibraryLogs();
    for (int i = 0; i < 5000; ++i) {
      GOOGLE_LOG(WARNING) << "String field contains invalid UTF-8 data " << i;
    }
    GOOGLE_LOG(INFO) << "below the level kept";
  });
  EXPECT_GE(Lines(out), 1u) << out;
  EXPECT_LE(Lines(out), 2u * kProtobufLinesPerSecond) << out;
  EXPECT_NE(out.find("invalid UTF-8 data 0"), std::string::npos) << out;
  EXPECT_EQ(out.find("below the level kept"), std::string::npos) << out;
}

}  // namespace
}  // namespace gcomp::server
