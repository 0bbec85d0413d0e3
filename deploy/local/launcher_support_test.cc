#include "deploy/local/launcher_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace gcomp::launcher {
namespace {

std::string TempDir() {
  const char* d = getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

TEST(LauncherSupport, ReshardAtEntries) {
  absl::StatusOr<std::vector<ReshardEvent>> events = ParseReshardAt({"2:3", "5:1"}, 8);
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_EQ(events->size(), 2u);
  EXPECT_EQ((*events)[0].step, 2);
  EXPECT_EQ((*events)[0].shards, 3);
  EXPECT_EQ((*events)[1].step, 5);
  EXPECT_EQ((*events)[1].shards, 1);
  EXPECT_TRUE(ParseReshardAt({}, 1)->empty());
  EXPECT_TRUE(ParseReshardAt({"1:2", "7:4"}, 8).ok());  // the first and the last step allowed
  // Each rule, and the entry named as given.
  for (const std::vector<std::string>& bad :
       std::vector<std::vector<std::string>>{{"0:2"},       {"8:2"},  {"3:0"}, {"3"},
                                             {"3:2:1"},     {"x:2"},  {"3:y"},
                                             {"3:2", "3:4"}, {"4:2", "3:1"}}) {
    absl::StatusOr<std::vector<ReshardEvent>> got = ParseReshardAt(bad, 8);
    ASSERT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << bad.back();
    EXPECT_NE(got.status().message().find(absl::StrCat("got '", bad.back(), "'")),
              std::string::npos)
        << got.status();
  }
}

TEST(LauncherSupport, FieldsOfAFlatJsonLine) {
  const std::string json = R"({"ok":true,"steps":12,"error":"a \"b\"","digest":"ab12"})";
  EXPECT_EQ(Field(json, "ok"), "true");
  EXPECT_EQ(Field(json, "digest"), "ab12");
  EXPECT_EQ(Num(json, "steps"), 12);
  EXPECT_EQ(Num(json, "absent"), 0);
  EXPECT_EQ(Field(json, "absent"), std::nullopt);
  EXPECT_EQ(Escape("say \"hi\"\\\nnow"), "say \\\"hi\\\"\\\\\\nnow");
  // A shard's status message in an error: terminal commands and direction overrides too.
  EXPECT_EQ(Escape("\x1b[31mEVIL\xe2\x80\xae\xc2\x9b"
                   "2J"),
            "\\u001b[31mEVIL\\u202e\\u009b2J");
}

TEST(LauncherSupport, WhyFromLogTakesTheLastErrorLine) {
  const std::string log =
      "2026-12-07T01:29:14.038 W gcomp_server[0]] security: INSECURE\n"
      "2026-12-07T01:29:14.047 E gcomp_server[0]] INVALID_ARGUMENT: decode_threads must be 1 "
      "to 256, got 0\n"
      "2026-12-07T01:29:14.048 I gcomp_server[0]] stopped\n\n";
  EXPECT_EQ(WhyFromLog(log), "INVALID_ARGUMENT: decode_threads must be 1 to 256, got 0");
  // Without an error line, the last line (a crash's own words, say).
  EXPECT_EQ(WhyFromLog("a\nterminate called after throwing\n  \n"),
            "terminate called after throwing");
  EXPECT_EQ(WhyFromLog(""), "");
  // Bounded, and cut at a character: 3-byte characters, 10 bytes kept of 12.
  EXPECT_EQ(WhyFromLog("t E n] \u20ac\u20ac\u20ac\u20ac", 10), "\u20ac\u20ac\u20ac");
}

TEST(LauncherSupport, ProgressFile) {
  const std::string path = TempDir() + "/progress";
  std::ofstream(path) << "7 1000 250\n";
  std::optional<Progress> p = ReadProgress(path);
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->steps, 7);
  EXPECT_EQ(p->raw_bytes, 1000u);
  EXPECT_EQ(p->wire_bytes, 250u);
  EXPECT_FALSE(ReadProgress(TempDir() + "/no-such-file").has_value());
}

TEST(LauncherSupport, WorkerResultsTogether) {
  const std::string dir = TempDir() + "/results";
  ASSERT_EQ(system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/worker0.json")
      << R"({"worker":0,"ok":true,"bound_ok":true,"bound_checked":true,"steps":5,)"
      << R"("raw_bytes":100,"wire_bytes":40,"max_abs_error":0.5,"digest":"aa","step_ms":"3,1"})";
  std::ofstream(dir + "/worker1.json")
      << R"({"worker":1,"ok":true,"bound_ok":true,"steps":4,"raw_bytes":100,"wire_bytes":60,)"
      << R"("max_abs_error":0.25,"digest":"bb","step_ms":"2","error":""})";
  WorkerResults r = ReadWorkerResults(dir, {0, 0}, 5);
  EXPECT_TRUE(r.ok);
  EXPECT_TRUE(r.bound_checked);
  EXPECT_FALSE(r.identical);  // digests differ
  EXPECT_EQ(r.raw_bytes, 200);
  EXPECT_EQ(r.wire_bytes, 100);
  EXPECT_EQ(r.max_abs_error, 0.5);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(r.digest, "aa");
  EXPECT_EQ(r.step_ms.size(), 3u);
  // A third worker wrote nothing: it died, and says so with its wait status.
  r = ReadWorkerResults(dir, {0, 0, 9}, 5);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.first_error, "worker-2 died (wait status 9)");
}

// The reason OutliveChildren exists: a child spawned by a thread that then exits gets
// SIGTERM; one spawned by a thread that waits for the notification does not.
TEST(LauncherSupport, ChildOfAnExitedThreadIsTerminatedUnlessTheThreadOutlivesIt) {
  const std::string out = TempDir() + "/child.out", err = TempDir() + "/child.err";
  for (bool outlive : {false, true}) {
    absl::Notification stopping, spawned;
    pid_t child = -1;
    std::thread t([&] {
      std::optional<OutliveChildren> hold;
      if (outlive) hold.emplace(&stopping);
      child = Spawn({"/bin/sleep", "1"}, out, err);
      spawned.Notify();
      usleep(200 * 1000);  // the child reaches its prctl before this thread leaves
    });
    spawned.WaitForNotification();
    int st = 0;
    ASSERT_EQ(waitpid(child, &st, 0), child);
    if (outlive) {
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
    } else {
      EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) << "status " << st;
    }
    stopping.Notify();
    t.join();
  }
}

}  // namespace
}  // namespace gcomp::launcher
