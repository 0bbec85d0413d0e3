// Replays the committed seed corpus and crash regressions of one fuzz target (named by
// GCOMP_FUZZ_TARGET at compile time) in the ordinary test suite; see docs/FUZZING.md.
// An input that crashes, leaks (under --config=asan) or breaks a property the target
// checks fails this test.
#include <chrono>
#include <cstdio>

#include "fuzz/replay.h"
#include "gtest/gtest.h"

#define GCOMP_FUZZ_STR2(x) #x
#define GCOMP_FUZZ_STR(x) GCOMP_FUZZ_STR2(x)

namespace gcomp::fuzz {
namespace {

constexpr const char* kTarget = GCOMP_FUZZ_STR(GCOMP_FUZZ_TARGET);

std::string CorpusDir() { return std::string("fuzz/corpus/") + kTarget; }
std::string RegressionDir() { return std::string("fuzz/regressions/") + kTarget; }

void ReplayAll(const std::vector<std::string>& files) {
  for (const std::string& file : files) {
    // Printed before the run, so that the log of a crashed test names the input.
    std::fprintf(stderr, "replaying %s\n", file.c_str());
    absl::StatusOr<std::string> bytes = ReadInput(file);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    const auto start = std::chrono::steady_clock::now();
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    // libFuzzer runs with -timeout=10; an input near it would be a slow-input finding.
    EXPECT_LT(seconds, 5.0) << file << " took " << seconds << " s";
  }
}

TEST(FuzzReplay, SeedCorpusIsPresent) {
  EXPECT_GE(ListInputs(CorpusDir()).size(), 3u) << "seed corpus missing at " << CorpusDir();
}

TEST(FuzzReplay, SeedCorpusRuns) { ReplayAll(ListInputs(CorpusDir())); }

TEST(FuzzReplay, CrashRegressionsRun) { ReplayAll(ListInputs(RegressionDir())); }

}  // namespace
}  // namespace gcomp::fuzz
