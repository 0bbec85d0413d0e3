// Local cluster launcher: starts S gcomp_server and W gcomp_worker processes on loopback,
// runs N steps on real gradients, checks that every worker got the same results within
// the codec's bound of the uncompressed reference, shuts everything down and prints one
// JSON line:
//   {"steps":..,"workers":..,"shards":..,"raw_bytes":..,"wire_bytes":..,"ratio":..,
//    "max_abs_error":..,"bound_ok":..,"step_ms_p50":.., ...}
// Exit status 0 iff every worker succeeded, results agree and bound_ok.
//
// With --reshard_at STEP:SHARDS,... the job moves between shard maps while it trains (live
// re-sharding, docs/SERVICE.md): added shards start with the new config, the switch is
// triggered through `gcomp_admin reshard --at_step STEP` (--reshard_trigger admin) or by
// rewriting the shards' config file (file), removed shards are stopped once drained. The
// launcher first runs the same job on fixed shards (a child launcher) and reports whether
// every result matched it bit for bit: "identical_to_fixed", beside "reshards",
// "chunks_moved" and "bytes_moved".
//
// With --replicas 2 --kill_shard K[,K2...] --kill_at_step N [--restart_after_ms T], the
// shards are SIGKILLed as worker 0 starts step N (and restarted T ms later, empty, as a
// restarted pod would be); the line gains "failovers" and "identical_to_undisturbed" (against the same
// job without the kill, run first). With --replicas 2 the launcher starts a local etcd
// (--etcd_members, default 1) and the shards keep the cluster's state there.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "base/build_info.h"
#include "base/files.h"
#include "base/process_usage.h"
#include "base/progress.h"
#include "base/progress_flags.h"
#include "base/usage_trend.h"
#include "cluster/cluster_config.h"
#include "coord/etcd_process.h"
#include "deploy/local/launcher_support.h"

ABSL_FLAG(int, shards, 2, "Shard processes.");
ABSL_FLAG(int, workers, 2, "Worker processes.");
ABSL_FLAG(int, steps, 3, "Steps.");
ABSL_FLAG(std::vector<std::string>, gradients, {}, "Comma-separated float32 .npy files.");
ABSL_FLAG(std::string, mode, "near-lossless", "none|lossless|near-lossless (both directions).");
ABSL_FLAG(int, rel_bits, 7, "Near-lossless relative mantissa bits.");
ABSL_FLAG(int, abs_log2, -16, "Near-lossless absolute floor (log2, relative to block max).");
ABSL_FLAG(std::string, optimizer, "none", "none|sgd|momentum|adam.");
ABSL_FLAG(double, learning_rate, 0.01, "Optimizer learning rate.");
ABSL_FLAG(int64_t, chunk_bytes, 1 << 20, "Chunk size in bytes.");
ABSL_FLAG(int, step_timeout_ms, 10000, "Shard step timeout.");
ABSL_FLAG(int, decode_threads, 2, "Decode threads per shard.");
ABSL_FLAG(int, kill_worker, -1, "Testing: the worker to SIGKILL mid-step.");
ABSL_FLAG(int, kill_at_step, 1,
          "Testing: the step at which --kill_worker dies, or --kill_shard is SIGKILLed (when "
          "worker 0 starts it, so pushes are in flight).");
ABSL_FLAG(std::vector<std::string>, kill_shard, {},
          "Testing failover: the shards (K or K1,K2,...) to SIGKILL at once at --kill_at_step "
          "(use --replicas 2). The JSON line gains failovers and identical_to_undisturbed "
          "(against a run without the kill, made first).");
ABSL_FLAG(int, restart_after_ms, -1,
          "With --kill_shard: restart them (same address and index, empty memory) this many "
          "ms after the kill; -1: never.");
ABSL_FLAG(int, replicas, 1, "Config replicas: copies of each chunk's state (failover needs 2).");
ABSL_FLAG(int, etcd_members, -1,
          "Local etcd members the launcher starts for the cluster's state (config "
          "coordination.etcd): 1 to 7; 0 none; -1 (default) one when --replicas >= 2. The JSON "
          "line gains etcd_members.");
ABSL_FLAG(std::vector<std::string>, set, {},
          "More config fields, field=value as the binaries' --set takes them (e.g. "
          "max_inflight_chunks=2): checked here, then given to every shard, worker and admin call.");
ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address the shards listen on; a comma-separated list gives shard k the k-th "
          "(cycling), e.g. one network namespace per shard.");
ABSL_FLAG(std::string, server_prefix, "",
          "Command prefix for shard processes (e.g. 'ip netns exec NS' for the benchmark); "
          "{index} stands for the shard's index.");
ABSL_FLAG(int, base_port, 0, "First shard port; 0 picks free loopback ports.");
ABSL_FLAG(std::string, server_bin, "", "gcomp_server path (default: from runfiles).");
ABSL_FLAG(std::string, worker_bin, "", "gcomp_worker path (default: from runfiles).");
ABSL_FLAG(std::string, admin_bin, "", "gcomp_admin path (default: from runfiles).");
ABSL_FLAG(std::vector<std::string>, reshard_at, {},
          "Re-shard while training: STEP:SHARDS,... (e.g. 4:3,8:2); shards are added or removed "
          "at the end of the list.");
ABSL_FLAG(std::string, reshard_trigger, "admin",
          "admin: gcomp_admin reshard --at_step STEP; file: rewrite the watched config file.");
ABSL_FLAG(std::string, checkpoint_dir, "", "Shards write checkpoints here (config checkpoint.dir).");
ABSL_FLAG(int, checkpoint_every, 0, "With --checkpoint_dir: checkpoint.every_steps.");
ABSL_FLAG(bool, verify_all, false,
          "Every worker checks its results against the reference (default: worker 0 only; "
          "the others are compared with it by digest).");
ABSL_FLAG(std::string, label, "", "Extra \"label\" key in the JSON line.");
ABSL_FLAG(bool, keep_logs, false, "Keep the run directory with process logs.");
ABSL_FLAG(int, soak_from_step, -1,
          "Soak check: sample every process's resident memory and open files every 250 ms "
          "from this step (after warm-up) to the end; the JSON line gains rss_growth_pct, "
          "fd_growth_pct (change of the median of the first and last tenth of the samples), "
          "rss_peak_growth_pct (of their maxima) and soak_ok, and the run fails if the "
          "median RSS or open files grow more than --soak_max_growth_pct. -1: off.");
ABSL_FLAG(double, soak_max_growth_pct, 5.0, "Growth allowed by the soak check, in percent.");
ABSL_FLAG(std::string, soak_samples, "",
          "Soak check: also write every sample to this file, one line each: seconds since "
          "the first sample, worker 0's step, process name, resident bytes, open files.");
ABSL_FLAG(int, metrics_base_port, 0,
          "Shard K serves Prometheus metrics on --host:(this + K); 0 picks free ports. The "
          "JSON line's metrics_ports lists them.");
ABSL_FLAG(int, linger_ms, 0,
          "Keep the shards up this long after the workers finish (e.g. for a last scrape).");

namespace {

using gcomp::launcher::BaselineDigest;
using gcomp::launcher::CheckSoak;
using gcomp::launcher::Escape;
using gcomp::launcher::FindBinary;
using gcomp::launcher::FreePort;
using gcomp::launcher::Num;
using gcomp::launcher::OutliveChildren;
using gcomp::launcher::Progress;
using gcomp::launcher::ReadFile;
using gcomp::launcher::ReadProgress;
using gcomp::launcher::ParseReshardAt;
using gcomp::launcher::ReadWorkerResults;
using gcomp::launcher::ReshardEvent;
using gcomp::launcher::SoakTrack;
using gcomp::launcher::Spawn;
using gcomp::launcher::WhyFromLog;
using gcomp::launcher::WorkerResults;

double CpuSeconds(const struct rusage& u) {
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}
void FormatSeconds(std::string* out, double s) { absl::StrAppendFormat(out, "%.3f", s); }

// Shard k's host from --host (a list cycles).
std::string HostOf(int k) {
  const std::vector<std::string> hosts =
      absl::StrSplit(absl::GetFlag(FLAGS_host), ',', absl::SkipEmpty());
  return hosts.empty() ? std::string("127.0.0.1") : hosts[k % hosts.size()];
}

// Removes the launcher's temporary folder (logs, config) of a run.
void RemoveRunFolder(const std::string& dir) {
  // glibc marks system() warn_unused_result, which a (void) cast does not silence.
  if (system(absl::StrCat("rm -rf '", dir, "'").c_str()) != 0) {
    fprintf(stderr, "cluster: could not remove %s\n", dir.c_str());
  }
}

// What the flags ask for, checked before anything starts.
struct Plan {
  int shards = 0;   // --shards: S
  int workers = 0;  // --workers: W
  int steps = 0;
  std::vector<std::string> gradients;  // relative paths resolved against `bazel run`'s folder
  gcomp::ProgressMode progress_mode = gcomp::ProgressMode::kAuto;
  std::vector<ReshardEvent> events;  // --reshard_at, steps rising
  std::string trigger;               // --reshard_trigger: admin or file
  std::vector<int> kill_shards;      // --kill_shard
  std::vector<std::string> overrides;  // --set, passed on to every process
  std::string set_arg;                 // the same as one argument
};

// The flags as a Plan; nullopt once the reason has been printed (exit status 2).
std::optional<Plan> PlanFromFlags() {
  Plan plan;
  const int S = plan.shards = absl::GetFlag(FLAGS_shards);
  const int W = plan.workers = absl::GetFlag(FLAGS_workers);
  const int steps = plan.steps = absl::GetFlag(FLAGS_steps);
  plan.gradients = absl::GetFlag(FLAGS_gradients);
  const char* bwd = getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`
  for (std::string& g : plan.gradients) {
    if (bwd != nullptr && !g.empty() && g[0] != '/') g = absl::StrCat(bwd, "/", g);
  }
  if (S < 1 || W < 1 || steps < 1 || plan.gradients.empty()) {
    fprintf(stderr, "cluster: need --shards >= 1, --workers >= 1, --steps >= 1, --gradients\n");
    return std::nullopt;
  }
  const absl::StatusOr<gcomp::ProgressMode> progress_mode = gcomp::ProgressModeFromFlags();
  if (!progress_mode.ok()) {
    fprintf(stderr, "cluster: --progress: %s\n", progress_mode.status().ToString().c_str());
    return std::nullopt;
  }
  plan.progress_mode = *progress_mode;
  absl::StatusOr<std::vector<ReshardEvent>> events =
      ParseReshardAt(absl::GetFlag(FLAGS_reshard_at), steps);
  if (!events.ok()) {
    fprintf(stderr, "cluster: --reshard_at: %s\n", std::string(events.status().message()).c_str());
    return std::nullopt;
  }
  plan.events = *std::move(events);
  plan.trigger = absl::GetFlag(FLAGS_reshard_trigger);
  if (plan.trigger != "admin" && plan.trigger != "file") {
    fprintf(stderr, "cluster: --reshard_trigger must be admin or file, got '%s'\n",
            plan.trigger.c_str());
    return std::nullopt;
  }
  if (!plan.events.empty() && absl::GetFlag(FLAGS_base_port) > 0) {
    fprintf(stderr, "cluster: --reshard_at picks free ports; drop --base_port\n");
    return std::nullopt;
  }
  for (const std::string& k : absl::GetFlag(FLAGS_kill_shard)) {
    int index = -1;
    if (!absl::SimpleAtoi(k, &index) || index < 0 || index >= S ||
        absl::GetFlag(FLAGS_kill_at_step) < 1 || absl::GetFlag(FLAGS_kill_at_step) >= steps) {
      fprintf(stderr, "cluster: --kill_shard takes shard indexes below --shards (%d), with "
                      "1 <= --kill_at_step < --steps; got '%s'\n", S, k.c_str());
      return std::nullopt;
    }
    plan.kill_shards.push_back(index);
  }
  const int kill_worker = absl::GetFlag(FLAGS_kill_worker);
  if (kill_worker < -1 || kill_worker >= W ||
      (kill_worker >= 0 &&
       (absl::GetFlag(FLAGS_kill_at_step) < 0 || absl::GetFlag(FLAGS_kill_at_step) >= steps))) {
    fprintf(stderr,
            "cluster: --kill_worker takes a worker index below --workers (%d), with "
            "0 <= --kill_at_step < --steps; got %d\n",
            W, kill_worker);
    return std::nullopt;
  }
  if (absl::GetFlag(FLAGS_replicas) < 1 || absl::GetFlag(FLAGS_replicas) > S) {
    fprintf(stderr, "cluster: --replicas must be in [1, --shards]\n");
    return std::nullopt;
  }
  plan.overrides = absl::GetFlag(FLAGS_set);
  plan.set_arg = absl::StrCat("--set=", absl::StrJoin(plan.overrides, ","));
  return plan;
}

// The cluster config the flags make, for the shard addresses `list` at shard-map `epoch`.
std::string ConfigText(const Plan& plan, const std::vector<std::string>& list, int epoch,
                       const gcomp::coord::EtcdCluster* etcd) {
  std::ostringstream c;
  c << "job: local\nworkers: " << plan.workers << "\nshards: [" << absl::StrJoin(list, ", ")
    << "]\n"
    << "shard_map_epoch: " << epoch << "\n"
    << "chunk_bytes: " << absl::GetFlag(FLAGS_chunk_bytes) << "\n"
    << "replicas: " << absl::GetFlag(FLAGS_replicas) << "\n";
  if (!absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
    c << "checkpoint: {dir: " << absl::GetFlag(FLAGS_checkpoint_dir)
      << ", every_steps: " << absl::GetFlag(FLAGS_checkpoint_every) << "}\n";
  }
  for (const char* d : {"uplink", "downlink"}) {
    c << d << ": {mode: " << absl::GetFlag(FLAGS_mode)
      << ", rel_bits: " << absl::GetFlag(FLAGS_rel_bits)
      << ", abs_log2: " << absl::GetFlag(FLAGS_abs_log2) << "}\n";
  }
  c << "optimizer: {name: " << absl::GetFlag(FLAGS_optimizer)
    << ", learning_rate: " << absl::GetFlag(FLAGS_learning_rate) << "}\n"
    << "step_timeout_ms: " << absl::GetFlag(FLAGS_step_timeout_ms) << "\n"
    << "rpc_timeout_ms: " << absl::GetFlag(FLAGS_step_timeout_ms) * 2 + 5000 << "\n"
    << "connect_timeout_ms: 20000\n";
  if (etcd != nullptr) {
    c << "coordination: {etcd: [" << absl::StrJoin(etcd->endpoints(), ", ") << "]}\n";
  }
  return c.str();
}

// How one re-shard went (the thread beside the monitor loop fills it).
struct ReshardOutcome {
  std::string json;  // the coordinator's line, or empty
  std::string error;
};

// The processes of one run and what the threads beside the monitor loop share with it.
class Run {
 public:
  // `plan` must outlive the Run.
  explicit Run(const Plan& plan) : plan_(plan), left_(plan.workers) {}

  // Finds the binaries, makes the run folder, starts etcd where asked and writes the first
  // config, checked as the shards will check it. 0, or the exit status after the reason has
  // been printed.
  int Prepare(const char* argv0);
  // Starts the shards and the workers.
  void StartProcesses();
  // Opens --soak_samples; false (exit status 2) after the reason has been printed.
  bool OpenSoakSamples();
  // Runs until every worker has ended, drawing the progress line and sampling the soak
  // check meanwhile, with the re-shards and shard kills on threads of their own.
  void Monitor();
  // Stops the shards and checks that each ended as asked.
  void StopShards();
  // Prints the JSON line (and where the logs are); the exit status.
  int Summarize(const std::string& fixed_digest);

 private:
  std::string ProgressPath() const { return dir_ + "/worker0.progress"; }
  // Written to a temporary name and renamed over `path`: a watcher never sees half a file.
  bool WriteConfig(const std::string& path, const std::vector<std::string>& list, int epoch) {
    return gcomp::WriteFileAtomically(path, ConfigText(plan_, list, epoch, etcd_.get())).ok();
  }
  pid_t StartShard(const std::string& config, int k, int metrics_port);
  std::vector<std::string> WorkerArgs(int w) const;
  // Samples every live process (after the soak's first step has been reached).
  void SampleSoak();
  // The --reshard_at thread: re-shards, one after the other.
  void Reshard();
  // The --kill_shard thread: SIGKILL when worker 0 starts step --kill_at_step, maybe restart
  // them later.
  void KillShards();
  // Adds "reshards", "chunks_moved", "bytes_moved" and "identical_to_fixed" to `json`; false
  // if a re-shard failed or the results differ.
  bool SummarizeReshards(const std::string& digest, const std::string& fixed_digest,
                         std::string* json, std::string* first_error) const;
  // Adds "failovers" and "identical_to_undisturbed"; false if the kill failed or the results
  // differ.
  bool SummarizeFailovers(const std::string& digest, const std::string& fixed_digest,
                          std::string* json, std::string* first_error) const;

  const Plan& plan_;
  std::string dir_;          // the run folder: config, logs, worker output
  std::string config_path_;  // the first config (the file trigger rewrites it)
  std::string server_bin_, worker_bin_, admin_bin_;
  int etcd_members_ = 0;
  std::unique_ptr<gcomp::coord::EtcdCluster> etcd_;
  std::vector<std::string> shards_;  // addresses; grows with re-shards
  std::vector<int> metrics_ports_;   // of the first shards
  std::vector<pid_t> servers_;       // index: position in `shards_`
  std::vector<pid_t> workers_;
  // Every shard process's own log, shard<N>.log, N counting starts (restarts and re-shards
  // included): two restarts must not share (and truncate) one file.
  std::atomic<int> shard_starts_{0};
  absl::Mutex logs_mu_;
  std::map<pid_t, std::string> log_of_;  // guarded by logs_mu_
  std::atomic<int> left_;  // workers still running (the re-shard thread reads it too)
  // Notified once the workers are done and the launcher is about to stop the shards.
  absl::Notification stopping_;

  // The worker side, once reaped.
  std::vector<int> status_;
  std::vector<double> worker_cpu_s_;  // user + system seconds
  std::map<pid_t, int> early_exits_;  // wait status of children other than workers
  bool stopped_workers_ = false;      // for a shard that exited with an error
  // The shard side, once stopped.
  std::vector<double> shard_cpu_s_;
  std::string shard_error_;

  std::vector<ReshardOutcome> reshards_;
  std::string kill_error_;

  // The soak check (--soak_from_step).
  std::vector<SoakTrack> soak_;
  bool soak_started_ = false;
  bool soak_done_ = false;
  absl::Time soak_t0_;
  FILE* samples_out_ = nullptr;
};

int Run::Prepare(const char* argv0) {
  server_bin_ = FindBinary(absl::GetFlag(FLAGS_server_bin), "server/gcomp_server", argv0);
  worker_bin_ = FindBinary(absl::GetFlag(FLAGS_worker_bin), "worker/gcomp_worker", argv0);
  admin_bin_ = FindBinary(absl::GetFlag(FLAGS_admin_bin), "admin/gcomp_admin", argv0);
  char tmpl[] = "/tmp/gcomp_cluster_XXXXXX";
  dir_ = mkdtemp(tmpl);
  for (int k = 0; k < plan_.shards; ++k) {
    int port = absl::GetFlag(FLAGS_base_port) > 0 ? absl::GetFlag(FLAGS_base_port) + k : FreePort();
    shards_.push_back(absl::StrCat(HostOf(k), ":", port));
  }
  etcd_members_ = absl::GetFlag(FLAGS_etcd_members);
  if (etcd_members_ < 0) etcd_members_ = absl::GetFlag(FLAGS_replicas) >= 2 ? 1 : 0;
  if (etcd_members_ > 7) {
    fprintf(stderr, "cluster: --etcd_members must be in [-1, 7], got %d\n", etcd_members_);
    RemoveRunFolder(dir_);
    return 2;
  }
  if (etcd_members_ > 0) {
    gcomp::coord::EtcdClusterOptions eo;
    eo.members = etcd_members_;
    eo.data_dir = dir_ + "/etcd";
    absl::StatusOr<std::unique_ptr<gcomp::coord::EtcdCluster>> started =
        gcomp::coord::EtcdCluster::Start(eo);
    if (!started.ok()) {
      fprintf(stderr, "cluster: starting etcd (--etcd_members %d): %s\n", etcd_members_,
              std::string(started.status().message()).c_str());
      RemoveRunFolder(dir_);
      return 1;
    }
    etcd_ = *std::move(started);
  }
  config_path_ = dir_ + "/cluster.yaml";
  // A write that fails shows as the load's NotFound just below.
  WriteConfig(config_path_, shards_, 1);
  // The config the flags make, checked as the shards will check it, before any process
  // starts: a bad --mode, port or --set stops here with the config's own message.
  absl::StatusOr<gcomp::proto::ClusterConfig> checked =
      gcomp::cluster::LoadClusterConfig(config_path_, plan_.overrides);
  if (!checked.ok()) {
    fprintf(stderr, "cluster: %s%s\n", plan_.overrides.empty() ? "" : "the flags with --set: ",
            std::string(checked.status().message()).c_str());
    RemoveRunFolder(dir_);
    return 2;
  }
  for (int k = 0; k < plan_.shards; ++k) {
    const int base = absl::GetFlag(FLAGS_metrics_base_port);
    metrics_ports_.push_back(base > 0 ? base + k : FreePort());
  }
  return 0;
}

pid_t Run::StartShard(const std::string& config, int k, int metrics_port) {
  std::vector<std::string> args;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_server_prefix), ' ', absl::SkipEmpty())) {
    args.push_back(absl::StrReplaceAll(p, {{"{index}", std::to_string(k)}}));
  }
  args.insert(args.end(), {server_bin_, "--config", config, "--shard", std::to_string(k),
                           absl::StrCat("--decode_threads=", absl::GetFlag(FLAGS_decode_threads)),
                           absl::StrCat("--metrics_address=", HostOf(k), ":", metrics_port)});
  if (!plan_.events.empty()) args.push_back("--config_poll_ms=200");
  if (!plan_.overrides.empty()) args.push_back(plan_.set_arg);
  const int n = shard_starts_++;
  const std::string log = absl::StrCat("shard", n, ".log");
  const pid_t pid = Spawn(args, absl::StrCat(dir_, "/shard", n, ".out"), absl::StrCat(dir_, "/", log));
  absl::MutexLock lock(&logs_mu_);
  log_of_[pid] = log;
  return pid;
}

std::vector<std::string> Run::WorkerArgs(int w) const {
  std::vector<std::string> args = {worker_bin_, "--config", config_path_, "--worker",
                                   std::to_string(w), "--steps", std::to_string(plan_.steps),
                                   "--gradients", absl::StrJoin(plan_.gradients, ",")};
  // One worker checks results against the reference; the digests show the rest match.
  if (w != 0 && !absl::GetFlag(FLAGS_verify_all)) args.push_back("--verify=false");
  if (!plan_.overrides.empty()) args.push_back(plan_.set_arg);
  if (w == 0) {
    // The launcher's progress line and soak check follow worker 0's step count.
    args.push_back(absl::StrCat("--progress_file=", ProgressPath()));
    args.push_back("--progress=never");
  }
  if (w == 0 && absl::GetFlag(FLAGS_soak_from_step) >= 0) {
    // Checked step by step: results kept for a check at the end would grow by design.
    args.push_back("--defer_checks_bytes=0");
  }
  if (w == absl::GetFlag(FLAGS_kill_worker)) {
    args.push_back(absl::StrCat("--kill_at_step=", absl::GetFlag(FLAGS_kill_at_step)));
  }
  return args;
}

void Run::StartProcesses() {
  for (int k = 0; k < plan_.shards; ++k) {
    servers_.push_back(StartShard(config_path_, k, metrics_ports_[k]));
  }
  for (int w = 0; w < plan_.workers; ++w) {
    workers_.push_back(Spawn(WorkerArgs(w), absl::StrCat(dir_, "/worker", w, ".json"),
                             absl::StrCat(dir_, "/worker", w, ".log")));
  }
  for (int k = 0; k < plan_.shards; ++k) soak_.push_back({absl::StrCat("shard-", k), servers_[k], {}});
  for (int w = 0; w < plan_.workers; ++w) {
    soak_.push_back({absl::StrCat("worker-", w), workers_[w], {}});
  }
  status_.assign(plan_.workers, -1);
  worker_cpu_s_.assign(plan_.workers, 0.0);
}

bool Run::OpenSoakSamples() {
  if (absl::GetFlag(FLAGS_soak_samples).empty()) return true;
  samples_out_ = fopen(absl::GetFlag(FLAGS_soak_samples).c_str(), "w");
  if (samples_out_ == nullptr) {
    fprintf(stderr, "cluster: cannot write --soak_samples %s: %s\n",
            absl::GetFlag(FLAGS_soak_samples).c_str(), strerror(errno));
    return false;
  }
  return true;
}

void Run::SampleSoak() {
  if (soak_done_) return;
  const std::optional<Progress> p = ReadProgress(ProgressPath());
  if (!p) return;
  const int64_t progress = p->steps;
  if (!soak_started_ && progress < absl::GetFlag(FLAGS_soak_from_step)) return;
  if (!soak_started_) soak_t0_ = absl::Now();
  soak_started_ = true;
  // Workers that do not verify finish the last step before worker 0 reports it and
  // start tearing down (channels close, buffers are freed): not the steady state the
  // check is about, so sampling ends one step before the end.
  if (progress >= plan_.steps - 1) {
    soak_done_ = true;
    return;
  }
  for (SoakTrack& t : soak_) {
    // Stop at the first worker's exit: the shards then close its connections and free
    // its buffers, which is not the steady state the check is about.
    if (t.pid == 0 || left_ < plan_.workers) continue;
    absl::StatusOr<gcomp::ProcessUsage> u = gcomp::ReadProcessUsage(t.pid);
    if (!u.ok()) continue;
    t.samples.push_back(*u);
    if (samples_out_ != nullptr) {
      fprintf(samples_out_, "%.3f\t%lld\t%s\t%llu\t%llu\n",
              absl::ToDoubleSeconds(absl::Now() - soak_t0_), static_cast<long long>(progress),
              t.name.c_str(), static_cast<unsigned long long>(u->rss_bytes),
              static_cast<unsigned long long>(u->open_fds));
    }
  }
}

void Run::Reshard() {
  OutliveChildren outlive(&stopping_);
  const std::vector<ReshardEvent>& events = plan_.events;
  const std::string& trigger = plan_.trigger;
  std::vector<std::string> current = shards_;
  for (size_t i = 0; i < events.size(); ++i) {
    const ReshardEvent& ev = events[i];
    const int epoch = static_cast<int>(i) + 2;
    // The admin trigger fixes the switch step (--at_step), so it may come early; the file
    // one switches at the first step boundary after shard 0 sees the file, so the file
    // is rewritten one step before.
    while (trigger == "file") {
      const std::optional<Progress> p = ReadProgress(ProgressPath());
      if ((p && p->steps >= ev.step - 1) || ev.step <= 1) break;
      if (left_ == 0) {
        reshards_[i].error = absl::StrCat("the workers ended before step ", ev.step - 1,
                                          ", where re-shard ", i + 1, " was due");
        return;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    std::vector<std::string> next(current.begin(),
                                  current.begin() + std::min<size_t>(current.size(), ev.shards));
    while (static_cast<int>(next.size()) < ev.shards) {
      next.push_back(absl::StrCat(HostOf(static_cast<int>(next.size())), ":", FreePort()));
    }
    const std::string next_path =
        trigger == "file" ? config_path_ : absl::StrCat(dir_, "/cluster-epoch", epoch, ".yaml");
    if (!WriteConfig(next_path, next, epoch)) {
      reshards_[i].error = absl::StrCat("cannot write ", next_path);
      return;
    }
    for (size_t k = current.size(); k < next.size(); ++k) {
      servers_.push_back(StartShard(next_path, static_cast<int>(k), FreePort()));
    }
    if (trigger == "admin") {
      const std::string out = absl::StrCat(dir_, "/reshard", i, ".json");
      std::vector<std::string> admin_args = {admin_bin_, "reshard", "--config", next_path,
                                             absl::StrCat("--at_step=", ev.step),
                                             "--log_level=info"};
      if (!plan_.overrides.empty()) admin_args.push_back(plan_.set_arg);
      pid_t admin = Spawn(admin_args, out, absl::StrCat(dir_, "/reshard", i, ".log"));
      int st = 0;
      waitpid(admin, &st, 0);
      reshards_[i].json = std::string(absl::StripAsciiWhitespace(ReadFile(out)));
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        reshards_[i].error = absl::StrCat("gcomp_admin reshard to epoch ", epoch, ": ",
                                          std::string(absl::StripAsciiWhitespace(ReadFile(
                                              absl::StrCat(dir_, "/reshard", i, ".log")))));
        return;
      }
    } else {
      // Shard 0 of the running map coordinates and logs the outcome.
      const std::string done = absl::StrCat("re-shard done: {\"from_epoch\":", epoch - 1);
      const absl::Time give_up = absl::Now() + absl::Seconds(120);
      while (reshards_[i].json.empty() && absl::Now() < give_up) {
        for (size_t k = 0; k < servers_.size() && reshards_[i].json.empty(); ++k) {
          const std::string log = ReadFile(absl::StrCat(dir_, "/shard", k, ".log"));
          const size_t at = log.find(done);
          if (at != std::string::npos) {
            const size_t begin = at + std::string("re-shard done: ").size();
            reshards_[i].json = log.substr(begin, log.find('}', begin) - begin + 1);
          }
        }
        absl::SleepFor(absl::Milliseconds(50));
      }
      if (reshards_[i].json.empty()) {
        reshards_[i].error = absl::StrCat("the file-triggered re-shard to epoch ", epoch,
                                          " did not finish within 120 s (see the shard logs)");
        return;
      }
    }
    // Removed shards are drained: stop them (their final checkpoint would hold nothing).
    for (size_t k = next.size(); k < current.size(); ++k) {
      for (size_t s = 0; s < shards_.size(); ++s) {
        if (shards_[s] == current[k]) kill(servers_[s], SIGTERM);
      }
    }
    for (size_t k = current.size(); k < next.size(); ++k) shards_.push_back(next[k]);
    current = next;
  }
}

void Run::KillShards() {
  OutliveChildren outlive(&stopping_);
  if (plan_.kill_shards.empty()) return;
  const int at = absl::GetFlag(FLAGS_kill_at_step);
  while (true) {
    const std::optional<Progress> p = ReadProgress(ProgressPath());
    if (p && p->steps >= at) break;
    if (left_ == 0) {
      kill_error_ = absl::StrCat("the workers ended before step ", at, ", where shards ",
                                 absl::StrJoin(plan_.kill_shards, ","), " were to be killed");
      return;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  for (int k : plan_.kill_shards) kill(servers_[k], SIGKILL);
  const int restart_ms = absl::GetFlag(FLAGS_restart_after_ms);
  if (restart_ms < 0) return;
  absl::SleepFor(absl::Milliseconds(restart_ms));
  // Same address and index, empty memory: as a restarted pod.
  for (int k : plan_.kill_shards) {
    servers_[k] = StartShard(config_path_, k, metrics_ports_[k]);
  }
}

void Run::Monitor() {
  const int W = plan_.workers, steps = plan_.steps;
  const int soak_from = absl::GetFlag(FLAGS_soak_from_step);
  absl::Time next_sample = absl::Now();
  reshards_.resize(plan_.events.size());
  std::thread resharder([this] { Reshard(); });
  std::thread killer([this] { KillShards(); });

  // Workers end on their own: every call has a deadline. The launcher adds a last guard.
  const absl::Time guard = absl::Now() + absl::Seconds(60 + steps * 60);
  gcomp::ProgressMeter meter(steps, absl::Now());
  int64_t shown_steps = 0;
  gcomp::ProgressPrinter printer(stderr, gcomp::ProgressEnabled(plan_.progress_mode, STDERR_FILENO));
  while (left_ > 0) {
    if (soak_from >= 0 && absl::Now() >= next_sample) {
      SampleSoak();
      next_sample = absl::Now() + absl::Milliseconds(250);
    }
    if (printer.enabled()) {
      const std::optional<Progress> p = ReadProgress(ProgressPath());
      if (p && p->steps > shown_steps) {
        shown_steps = p->steps;
        if (std::optional<std::string> line = meter.Update(p->steps, p->raw_bytes, p->wire_bytes,
                                                           absl::Now())) {
          printer.Show(*line);
        }
      }
    }
    int st = 0;
    struct rusage usage {};
    pid_t p = wait4(-1, &st, WNOHANG, &usage);
    if (p > 0) {
      if (std::find(workers_.begin(), workers_.end(), p) == workers_.end()) {
        early_exits_[p] = st;  // a shard (or a stray child) that ended during the run
        // A shard that exited with an error (a flag or config it refused, a checkpoint
        // folder it cannot write, a fatal error) has failed the run: its workers would
        // only wait for it up to their connect timeout or step deadline.
        bool shard = false;
        {
          absl::MutexLock lock(&logs_mu_);  // `servers_` grows on the re-shard thread
          shard = log_of_.count(p) != 0;
        }
        if (shard && WIFEXITED(st) && WEXITSTATUS(st) != 0 && !stopped_workers_) {
          stopped_workers_ = true;
          for (int w = 0; w < W; ++w) {
            if (status_[w] == -1) kill(workers_[w], SIGTERM);
          }
        }
      }
      for (int w = 0; w < W; ++w) {
        if (workers_[w] == p) {
          status_[w] = st;
          worker_cpu_s_[w] = CpuSeconds(usage);
          --left_;
          for (SoakTrack& t : soak_) {
            if (t.pid == p) t.pid = 0;  // reaped: its pid may be reused
          }
        }
      }
      continue;
    }
    if (absl::Now() > guard) {
      for (int w = 0; w < W; ++w) if (status_[w] == -1) kill(workers_[w], SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  printer.Finish();
  if (samples_out_ != nullptr) fclose(samples_out_);
  if (absl::GetFlag(FLAGS_linger_ms) > 0) absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_linger_ms)));
  stopping_.Notify();
  resharder.join();
  killer.join();
}

void Run::StopShards() {
  for (pid_t s : servers_) kill(s, SIGTERM);
  // CPU time of the shards running at the end (a killed one's time went with it).
  // A shard must end as asked: exit 0 at SIGTERM (after its final checkpoint), or by the
  // SIGKILL of --kill_shard. Anything else (a failed checkpoint, a crash) fails the run.
  for (size_t k = 0; k < servers_.size(); ++k) {
    struct rusage usage {};
    int st = 0;
    const bool reaped = wait4(servers_[k], &st, 0, &usage) == servers_[k];
    shard_cpu_s_.push_back(reaped ? CpuSeconds(usage) : 0.0);
    if (!reaped) {
      const auto early = early_exits_.find(servers_[k]);
      if (early == early_exits_.end()) continue;
      st = early->second;
    }
    if (!shard_error_.empty()) continue;
    std::string log;
    {
      absl::MutexLock lock(&logs_mu_);
      log = log_of_[servers_[k]];
    }
    // SIGKILL is expected only of a --kill_shard shard that was not restarted (a restarted
    // one's pid here is the new process).
    const bool killed_here = std::find(plan_.kill_shards.begin(), plan_.kill_shards.end(),
                                       static_cast<int>(k)) != plan_.kill_shards.end();
    if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
      const std::string why = WhyFromLog(ReadFile(absl::StrCat(dir_, "/", log)));
      shard_error_ = absl::StrCat("shard ", k, " exited with status ", WEXITSTATUS(st), " (see ",
                                  log, why.empty() ? "" : ": ", why, ")");
    } else if (WIFSIGNALED(st) && WTERMSIG(st) != SIGTERM &&
               !(WTERMSIG(st) == SIGKILL && killed_here)) {
      shard_error_ = absl::StrCat("shard ", k, " died of signal ", WTERMSIG(st), " (see ", log, ")");
    }
  }
}

bool Run::SummarizeReshards(const std::string& digest, const std::string& fixed_digest,
                            std::string* json, std::string* first_error) const {
  const int steps = plan_.steps;
  bool reshards_ok = true;
  double moved_chunks = 0, moved_bytes = 0;
  std::vector<std::string> items;
  for (size_t i = 0; i < plan_.events.size(); ++i) {
    const ReshardOutcome& r = reshards_[i];
    if (r.json.empty() || !r.error.empty()) {
      reshards_ok = false;
      if (first_error->empty()) {
        *first_error = r.error.empty() ? absl::StrCat("re-shard ", i + 1, " did not run") : r.error;
      }
      continue;
    }
    moved_chunks += Num(r.json, "chunks_moved");
    moved_bytes += Num(r.json, "bytes_moved");
    items.push_back(r.json);
    // The switch comes at the asked step or later (past every step a chunk had started):
    // one past the last step means no step ran on the new map, and the run tested nothing
    // of it.
    const double switch_step = Num(r.json, "switch_step");
    if (switch_step >= steps) {
      reshards_ok = false;
      if (first_error->empty()) {
        *first_error = absl::StrFormat(
            "re-shard %d (asked for step %d) switched at step %.0f, after the last step (%d): "
            "no step ran on its map; give more --steps or an earlier STEP",
            static_cast<int>(i + 1), plan_.events[i].step, switch_step, steps - 1);
      }
    }
  }
  const bool same = digest == fixed_digest;
  if (!same && first_error->empty()) {
    *first_error = absl::StrCat("results differ from the fixed-shard run (digest ", digest,
                                " vs ", fixed_digest, ")");
  }
  *json = absl::StrFormat(",\"reshards\":[%s],\"chunks_moved\":%.0f,\"bytes_moved\":%.0f,"
                          "\"identical_to_fixed\":%s",
                          absl::StrJoin(items, ","), moved_chunks, moved_bytes,
                          same ? "true" : "false");
  return reshards_ok && same;
}

bool Run::SummarizeFailovers(const std::string& digest, const std::string& fixed_digest,
                             std::string* json, std::string* first_error) const {
  // Each failover is coordinated, and logged, by one shard.
  int failovers = 0;
  for (int k = 0; k < shard_starts_.load(); ++k) {
    const std::string log = ReadFile(absl::StrCat(dir_, "/shard", k, ".log"));
    for (size_t at = log.find("failover to epoch"); at != std::string::npos;
         at = log.find("failover to epoch", at + 1)) {
      ++failovers;
    }
  }
  const bool same = digest == fixed_digest;
  if (!kill_error_.empty() && first_error->empty()) *first_error = kill_error_;
  if (!same && first_error->empty()) {
    *first_error = absl::StrCat("results differ from the undisturbed run (digest ", digest,
                                " vs ", fixed_digest, ")");
  }
  *json = absl::StrFormat(",\"failovers\":%d,\"identical_to_undisturbed\":%s", failovers,
                          same ? "true" : "false");
  return same && kill_error_.empty();
}

int Run::Summarize(const std::string& fixed_digest) {
  const int S = plan_.shards, W = plan_.workers, steps = plan_.steps;
  const WorkerResults results = ReadWorkerResults(dir_, status_, steps);
  const bool ok = results.ok, bound_ok = results.bound_ok, identical = results.identical;
  const bool bound_checked = results.bound_checked;
  const double raw = results.raw_bytes, wire = results.wire_bytes, max_err = results.max_abs_error;
  const int done_steps = results.steps;
  const std::string& digest = results.digest;
  std::string first_error = results.first_error;
  std::vector<double> step_ms = results.step_ms;
  std::sort(step_ms.begin(), step_ms.end());
  const double p50 = step_ms.empty() ? 0 : step_ms[step_ms.size() / 2];
  double grad_bytes = 0;
  for (const std::string& g : plan_.gradients) {
    struct stat st;
    if (stat(g.c_str(), &st) == 0) grad_bytes += st.st_size - 128;  // minus the .npy header
  }
  const double gbps = p50 > 0 ? grad_bytes * W / (p50 / 1e3) / 1e9 : 0;
  bool soak_ok = true;
  std::string soak_json;
  const int soak_from = absl::GetFlag(FLAGS_soak_from_step);
  if (soak_from >= 0) {
    soak_ok = CheckSoak(soak_, soak_from, absl::GetFlag(FLAGS_soak_max_growth_pct), &soak_json,
                        &first_error);
  }
  std::string reshard_json;
  bool reshards_ok = true;
  if (!plan_.events.empty()) {
    reshards_ok = SummarizeReshards(digest, fixed_digest, &reshard_json, &first_error);
  }
  std::string failover_json;
  bool failover_ok = true;
  if (!plan_.kill_shards.empty()) {
    failover_ok = SummarizeFailovers(digest, fixed_digest, &failover_json, &first_error);
  }
  // A shard that failed is most often why the workers failed: it comes first.
  if (stopped_workers_) {
    // What the workers report after SIGTERM says nothing more.
    first_error = absl::StrCat(shard_error_, "; the launcher stopped the workers");
  } else if (!shard_error_.empty()) {
    first_error = first_error.empty() ? shard_error_ : absl::StrCat(shard_error_, "; ", first_error);
  }
  const bool all_ok =
      ok && identical && bound_ok && soak_ok && reshards_ok && failover_ok && shard_error_.empty();
  const std::string mode = absl::GetFlag(FLAGS_mode);
  printf("{\"steps\":%d,\"workers\":%d,\"shards\":%d,\"raw_bytes\":%.0f,\"wire_bytes\":%.0f,"
         "\"ratio\":%.4f,\"max_abs_error\":%.9g,\"bound_ok\":%s,\"step_ms_p50\":%.3f,"
         "\"mode\":\"%s\",\"optimizer\":\"%s\",\"identical\":%s,\"ok\":%s,\"raw_gb_per_s\":%.4f,"
         "\"label\":\"%s\",\"bound_checked\":%s%s%s%s%s,\"metrics_ports\":[%s],\"digest\":\"%s\","
         "\"error\":\"%s\"}\n",
         done_steps, W, S, raw, wire, wire > 0 ? raw / wire : 0.0, max_err,
         bound_ok ? "true" : "false", p50, mode.c_str(), absl::GetFlag(FLAGS_optimizer).c_str(),
         identical ? "true" : "false", all_ok ? "true" : "false", gbps,
         Escape(absl::GetFlag(FLAGS_label)).c_str(), bound_checked ? "true" : "false",
         soak_json.c_str(), reshard_json.c_str(),
         absl::StrCat(failover_json,
                      etcd_members_ > 0 ? absl::StrCat(",\"etcd_members\":", etcd_members_) : "")
             .c_str(),
         absl::StrFormat(",\"shard_cpu_s\":[%s],\"worker_cpu_s\":[%s]",
                         absl::StrJoin(shard_cpu_s_, ",", FormatSeconds),
                         absl::StrJoin(worker_cpu_s_, ",", FormatSeconds))
             .c_str(),
         absl::StrJoin(metrics_ports_, ",").c_str(),
         digest.c_str(), Escape(first_error).c_str());
  fflush(stdout);
  if (absl::GetFlag(FLAGS_keep_logs) || !all_ok) {
    fprintf(stderr, "cluster: logs in %s\n", dir_.c_str());
  } else {
    RemoveRunFolder(dir_);
  }
  return all_ok ? 0 : 1;
}

// The same job on fixed shards (no re-shard, no kill) first, by a child launcher, for
// identical_to_fixed and identical_to_undisturbed; false (exit status 1) if it failed.
bool RunBaseline(const Plan& plan, int argc, char** argv, std::string* fixed_digest) {
  if (plan.events.empty() && plan.kill_shards.empty()) return true;
  std::string error;
  *fixed_digest = BaselineDigest(
      argc, argv,
      {"--reshard_at", "--reshard_trigger", "--checkpoint_dir", "--label", "--kill_shard",
       "--restart_after_ms"},
      &error);
  if (fixed_digest->empty()) {
    fprintf(stderr, "cluster: the fixed-shard baseline run failed:\n%s\n", error.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  gcomp::InstallVersionFlag("cluster");
  absl::ParseCommandLine(argc, argv);
  const std::optional<Plan> plan = PlanFromFlags();
  if (!plan) return 2;
  std::string fixed_digest;
  if (!RunBaseline(*plan, argc, argv, &fixed_digest)) return 1;
  Run run(*plan);
  if (const int rc = run.Prepare(argv[0]); rc != 0) return rc;
  run.StartProcesses();
  if (!run.OpenSoakSamples()) return 2;
  run.Monitor();
  run.StopShards();
  return run.Summarize(fixed_digest);
}
