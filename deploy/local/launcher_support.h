// Processes, ports and files of the local cluster launcher (deploy/local/cluster_main.cc):
// starting children, free loopback ports, and reading what the workers write.
#ifndef GCOMP_DEPLOY_LOCAL_LAUNCHER_SUPPORT_H_
#define GCOMP_DEPLOY_LOCAL_LAUNCHER_SUPPORT_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "base/loopback_port.h"
#include "base/spawn.h"
#include "base/process_usage.h"

namespace gcomp::launcher {

// One --reshard_at entry: from step `step` on, the job runs on `shards` shards.
struct ReshardEvent {
  int step = 0;
  int shards = 0;
};

// --reshard_at's STEP:SHARDS entries for a run of `steps` steps: 1 <= STEP < steps (a
// re-shard needs a step before and one after it), SHARDS >= 1, steps rising.
// InvalidArgument naming the first entry that breaks a rule, as it was given.
absl::StatusOr<std::vector<ReshardEvent>> ParseReshardAt(const std::vector<std::string>& entries,
                                                         int steps);

// Whether a file exists at `p`.
bool Exists(const std::string& p);

// `flag` if set, else `rel` (a path inside this workspace) found beside the launcher: in
// its runfiles, or relative to bazel-bin.
std::string FindBinary(const std::string& flag, const std::string& rel, const char* argv0);

// Ports and children: base/loopback_port.h and base/spawn.h (the etcd members use them too).
using ::gcomp::FreePort;
using ::gcomp::Spawn;
using ::gcomp::UnusedPort;

// Held at the top of a helper thread that starts shards: on the thread's way out it waits
// until the launcher stops the shards itself. Without it, a shard restarted by such a thread
// got SIGTERM as the thread returned, and died before its first log line whenever its
// prctl ran before the thread's exit (intermittent, more often on a loaded machine).
class OutliveChildren {
 public:
  explicit OutliveChildren(absl::Notification* stopping) : stopping_(stopping) {}
  ~OutliveChildren() { stopping_->WaitForNotification(); }

 private:
  absl::Notification* stopping_;
};

// The whole file; empty if it cannot be read.
std::string ReadFile(const std::string& path);

// What a failed process's log says about why: the text of its last error line ("<time> E
// <name>] text"), else its last non-empty line; at most max_bytes (cut at a character), ""
// for an empty log.
std::string WhyFromLog(const std::string& log, size_t max_bytes = 400);

// The raw text of "key": value in a flat JSON line written by gcomp_worker.
std::optional<std::string> Field(const std::string& json, const std::string& key);
// The number at "key" (0 if absent).
double Num(const std::string& json, const std::string& key);

// What gcomp_worker --progress_file holds: "steps raw_bytes wire_bytes".
struct Progress {
  int64_t steps = 0;
  uint64_t raw_bytes = 0;
  uint64_t wire_bytes = 0;
};

std::optional<Progress> ReadProgress(const std::string& path);

// What the workers' JSON lines (dir/workerW.json) say together.
struct WorkerResults {
  bool ok = true;             // every worker wrote a line with "ok": true
  bool bound_ok = true;       // every worker's error bound held
  bool bound_checked = false;  // some worker checked the bound
  bool identical = true;      // every worker's digest is the same
  double raw_bytes = 0, wire_bytes = 0, max_abs_error = 0;
  int steps = 0;              // the fewest steps any worker finished
  std::string digest;         // the first worker's
  std::string first_error;    // the first worker's error, or which worker died
  std::vector<double> step_ms;  // every worker's step times
};
// Reads dir/worker0.json .. for the workers whose wait statuses are `wait_status`, of a job
// of `steps` steps.
WorkerResults ReadWorkerResults(const std::string& dir, const std::vector<int>& wait_status,
                                int steps);

// Resident memory and open files of one process, sampled from the soak check's first step
// (--soak_from_step) to one step before the end.
struct SoakTrack {
  std::string name;
  pid_t pid = 0;
  std::vector<ProcessUsage> samples;
};

// The soak check (--soak_from_step): prints each process's trend to stderr, fills *json
// with the JSON line's soak keys, and returns whether every process's resident memory and
// open files grew at most `max_growth_pct` (a process with fewer than two samples fails,
// named in *first_error if that is still empty).
bool CheckSoak(const std::vector<SoakTrack>& tracks, int from_step, double max_growth_pct,
               std::string* json, std::string* first_error);

// Runs this launcher again (argv) without the flags in `drop` (each "--flag=v" or "--flag v")
// and with --progress=never, and returns its JSON line's digest: the same job undisturbed,
// for identical_to_fixed and identical_to_undisturbed. Empty, with *error holding the run's
// output, if it failed.
std::string BaselineDigest(int argc, char** argv, const std::vector<std::string>& drop,
                           std::string* error);

// `s` as the inside of a JSON string (JsonQuote without its quotes): control characters,
// terminal commands and invalid UTF-8 escaped, so that text a shard or worker chose cannot
// break the summary line or act on a terminal.
std::string Escape(const std::string& s);

}  // namespace gcomp::launcher

#endif  // GCOMP_DEPLOY_LOCAL_LAUNCHER_SUPPORT_H_
