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
#include <fstream>
#include <map>
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
using gcomp::launcher::Field;
using gcomp::launcher::FindBinary;
using gcomp::launcher::FreePort;
using gcomp::launcher::Num;
using gcomp::launcher::OutliveChildren;
using gcomp::launcher::Progress;
using gcomp::launcher::ReadFile;
using gcomp::launcher::ReadProgress;
using gcomp::launcher::ReadWorkerResults;
using gcomp::launcher::SoakTrack;
using gcomp::launcher::Spawn;
using gcomp::launcher::WhyFromLog;
using gcomp::launcher::WorkerResults;

double CpuSeconds(const struct rusage& u) {
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
}
void FormatSeconds(std::string* out, double s) { absl::StrAppendFormat(out, "%.3f", s); }

// One --reshard_at entry.
struct ReshardEvent {
  int step = 0;
  int shards = 0;
};

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

}  // namespace

int main(int argc, char** argv) {
  gcomp::InstallVersionFlag("cluster");
  absl::ParseCommandLine(argc, argv);
  const int S = absl::GetFlag(FLAGS_shards), W = absl::GetFlag(FLAGS_workers);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::vector<std::string> grads = absl::GetFlag(FLAGS_gradients);
  const char* bwd = getenv("BUILD_WORKING_DIRECTORY");  // set by `bazel run`
  for (std::string& g : grads) {
    if (bwd != nullptr && !g.empty() && g[0] != '/') g = absl::StrCat(bwd, "/", g);
  }
  if (S < 1 || W < 1 || steps < 1 || grads.empty()) {
    fprintf(stderr, "cluster: need --shards >= 1, --workers >= 1, --steps >= 1, --gradients\n");
    return 2;
  }
  const absl::StatusOr<gcomp::ProgressMode> progress_mode_or = gcomp::ProgressModeFromFlags();
  if (!progress_mode_or.ok()) {
    fprintf(stderr, "cluster: --progress: %s\n", progress_mode_or.status().ToString().c_str());
    return 2;
  }
  const gcomp::ProgressMode progress_mode = *progress_mode_or;
  std::vector<ReshardEvent> events;
  for (const std::string& e : absl::GetFlag(FLAGS_reshard_at)) {
    std::vector<std::string> parts = absl::StrSplit(e, ':');
    ReshardEvent ev;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &ev.step) ||
        !absl::SimpleAtoi(parts[1], &ev.shards) || ev.step < 1 || ev.step >= steps ||
        ev.shards < 1 || (!events.empty() && ev.step <= events.back().step)) {
      fprintf(stderr, "cluster: --reshard_at: expected STEP:SHARDS with 1 <= STEP < --steps, "
                      "SHARDS >= 1, steps rising; got '%s'\n", e.c_str());
      return 2;
    }
    events.push_back(ev);
  }
  const std::string trigger = absl::GetFlag(FLAGS_reshard_trigger);
  if (trigger != "admin" && trigger != "file") {
    fprintf(stderr, "cluster: --reshard_trigger must be admin or file, got '%s'\n", trigger.c_str());
    return 2;
  }
  if (!events.empty() && absl::GetFlag(FLAGS_base_port) > 0) {
    fprintf(stderr, "cluster: --reshard_at picks free ports; drop --base_port\n");
    return 2;
  }
  std::vector<int> kill_shards;
  for (const std::string& k : absl::GetFlag(FLAGS_kill_shard)) {
    int index = -1;
    if (!absl::SimpleAtoi(k, &index) || index < 0 || index >= S ||
        absl::GetFlag(FLAGS_kill_at_step) < 1 || absl::GetFlag(FLAGS_kill_at_step) >= steps) {
      fprintf(stderr, "cluster: --kill_shard takes shard indexes below --shards (%d), with "
                      "1 <= --kill_at_step < --steps; got '%s'\n", S, k.c_str());
      return 2;
    }
    kill_shards.push_back(index);
  }
  const int kill_worker = absl::GetFlag(FLAGS_kill_worker);
  if (kill_worker < -1 || kill_worker >= W ||
      (kill_worker >= 0 &&
       (absl::GetFlag(FLAGS_kill_at_step) < 0 || absl::GetFlag(FLAGS_kill_at_step) >= steps))) {
    fprintf(stderr,
            "cluster: --kill_worker takes a worker index below --workers (%d), with "
            "0 <= --kill_at_step < --steps; got %d\n",
            W, kill_worker);
    return 2;
  }
  if (absl::GetFlag(FLAGS_replicas) < 1 || absl::GetFlag(FLAGS_replicas) > S) {
    fprintf(stderr, "cluster: --replicas must be in [1, --shards]\n");
    return 2;
  }
  // The same job on fixed shards (no re-shard, no kill) first, by a child launcher, for
  // identical_to_fixed and identical_to_undisturbed.
  std::string fixed_digest;
  if (!events.empty() || !kill_shards.empty()) {
    std::string error;
    fixed_digest = BaselineDigest(
        argc, argv,
        {"--reshard_at", "--reshard_trigger", "--checkpoint_dir", "--label", "--kill_shard",
         "--restart_after_ms"},
        &error);
    if (fixed_digest.empty()) {
      fprintf(stderr, "cluster: the fixed-shard baseline run failed:\n%s\n", error.c_str());
      return 1;
    }
  }
  const std::string server_bin = FindBinary(absl::GetFlag(FLAGS_server_bin), "server/gcomp_server", argv[0]);
  const std::string worker_bin = FindBinary(absl::GetFlag(FLAGS_worker_bin), "worker/gcomp_worker", argv[0]);
  const std::string admin_bin = FindBinary(absl::GetFlag(FLAGS_admin_bin), "admin/gcomp_admin", argv[0]);
  char tmpl[] = "/tmp/gcomp_cluster_XXXXXX";
  const std::string dir = mkdtemp(tmpl);

  std::vector<std::string> shards;
  for (int k = 0; k < S; ++k) {
    int port = absl::GetFlag(FLAGS_base_port) > 0 ? absl::GetFlag(FLAGS_base_port) + k : FreePort();
    shards.push_back(absl::StrCat(HostOf(k), ":", port));
  }
  int etcd_members = absl::GetFlag(FLAGS_etcd_members);
  if (etcd_members < 0) etcd_members = absl::GetFlag(FLAGS_replicas) >= 2 ? 1 : 0;
  if (etcd_members > 7) {
    fprintf(stderr, "cluster: --etcd_members must be in [-1, 7], got %d\n", etcd_members);
    RemoveRunFolder(dir);
    return 2;
  }
  std::unique_ptr<gcomp::coord::EtcdCluster> etcd;
  if (etcd_members > 0) {
    gcomp::coord::EtcdClusterOptions eo;
    eo.members = etcd_members;
    eo.data_dir = dir + "/etcd";
    absl::StatusOr<std::unique_ptr<gcomp::coord::EtcdCluster>> started =
        gcomp::coord::EtcdCluster::Start(eo);
    if (!started.ok()) {
      fprintf(stderr, "cluster: starting etcd (--etcd_members %d): %s\n", etcd_members,
              std::string(started.status().message()).c_str());
      RemoveRunFolder(dir);
      return 1;
    }
    etcd = *std::move(started);
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const std::string config_path = dir + "/cluster.yaml";
  // Written to a temporary name and renamed over `path`: a watcher never sees half a file.
  auto write_config = [&](const std::string& path, const std::vector<std::string>& list,
                          int epoch) {
    const std::string tmp = path + ".tmp";
    {
    std::ofstream c(tmp);
    c << "job: local\nworkers: " << W << "\nshards: [" << absl::StrJoin(list, ", ") << "]\n"
      << "shard_map_epoch: " << epoch << "\n"
      << "chunk_bytes: " << absl::GetFlag(FLAGS_chunk_bytes) << "\n"
      << "replicas: " << absl::GetFlag(FLAGS_replicas) << "\n";
    if (!absl::GetFlag(FLAGS_checkpoint_dir).empty()) {
      c << "checkpoint: {dir: " << absl::GetFlag(FLAGS_checkpoint_dir)
        << ", every_steps: " << absl::GetFlag(FLAGS_checkpoint_every) << "}\n";
    }
    for (const char* d : {"uplink", "downlink"}) {
      c << d << ": {mode: " << mode << ", rel_bits: " << absl::GetFlag(FLAGS_rel_bits)
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
    }
    return rename(tmp.c_str(), path.c_str()) == 0;
  };
  write_config(config_path, shards, 1);
  const std::vector<std::string> overrides = absl::GetFlag(FLAGS_set);
  // The config the flags make, checked as the shards will check it, before any process
  // starts: a bad --mode, port or --set stops here with the config's own message.
  absl::StatusOr<gcomp::proto::ClusterConfig> checked =
      gcomp::cluster::LoadClusterConfig(config_path, overrides);
  if (!checked.ok()) {
    fprintf(stderr, "cluster: %s%s\n", overrides.empty() ? "" : "the flags with --set: ",
            std::string(checked.status().message()).c_str());
    RemoveRunFolder(dir);
    return 2;
  }
  const std::string set_arg = absl::StrCat("--set=", absl::StrJoin(overrides, ","));
  std::vector<int> metrics_ports;
  for (int k = 0; k < S; ++k) {
    const int base = absl::GetFlag(FLAGS_metrics_base_port);
    metrics_ports.push_back(base > 0 ? base + k : FreePort());
  }
  std::vector<pid_t> servers;  // index: position in `shards` (which grows with re-shards)
  // Every shard process's own log, shard<N>.log, N counting starts (restarts and re-shards
  // included): two restarts must not share (and truncate) one file.
  std::atomic<int> shard_starts{0};
  absl::Mutex logs_mu;
  std::map<pid_t, std::string> log_of;  // guarded by logs_mu
  auto start_shard = [&](const std::string& config, int k, int metrics_port) {
    std::vector<std::string> args;
    for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_server_prefix), ' ', absl::SkipEmpty())) {
      args.push_back(absl::StrReplaceAll(p, {{"{index}", std::to_string(k)}}));
    }
    args.insert(args.end(), {server_bin, "--config", config, "--shard", std::to_string(k),
                             absl::StrCat("--decode_threads=", absl::GetFlag(FLAGS_decode_threads)),
                             absl::StrCat("--metrics_address=", HostOf(k), ":",
                                          metrics_port)});
    if (!events.empty()) args.push_back("--config_poll_ms=200");
    if (!overrides.empty()) args.push_back(set_arg);
    const int n = shard_starts++;
    const std::string log = absl::StrCat("shard", n, ".log");
    const pid_t pid =
        Spawn(args, absl::StrCat(dir, "/shard", n, ".out"), absl::StrCat(dir, "/", log));
    absl::MutexLock lock(&logs_mu);
    log_of[pid] = log;
    return pid;
  };
  for (int k = 0; k < S; ++k) servers.push_back(start_shard(config_path, k, metrics_ports[k]));
  std::vector<pid_t> workers;
  for (int w = 0; w < W; ++w) {
    std::vector<std::string> args = {worker_bin, "--config", config_path, "--worker",
                                     std::to_string(w), "--steps", std::to_string(steps),
                                     "--gradients", absl::StrJoin(grads, ",")};
    // One worker checks results against the reference; the digests show the rest match.
    if (w != 0 && !absl::GetFlag(FLAGS_verify_all)) args.push_back("--verify=false");
    if (!overrides.empty()) args.push_back(set_arg);
    if (w == 0) {
      // The launcher's progress line and soak check follow worker 0's step count.
      args.push_back(absl::StrCat("--progress_file=", dir, "/worker0.progress"));
      args.push_back("--progress=never");
    }
    if (w == 0 && absl::GetFlag(FLAGS_soak_from_step) >= 0) {
      // Checked step by step: results kept for a check at the end would grow by design.
      args.push_back("--defer_checks_bytes=0");
    }
    if (w == absl::GetFlag(FLAGS_kill_worker)) {
      args.push_back(absl::StrCat("--kill_at_step=", absl::GetFlag(FLAGS_kill_at_step)));
    }
    workers.push_back(Spawn(args, absl::StrCat(dir, "/worker", w, ".json"),
                            absl::StrCat(dir, "/worker", w, ".log")));
  }
  const int soak_from = absl::GetFlag(FLAGS_soak_from_step);
  std::vector<SoakTrack> soak;
  for (int k = 0; k < S; ++k) soak.push_back({absl::StrCat("shard-", k), servers[k], {}});
  for (int w = 0; w < W; ++w) soak.push_back({absl::StrCat("worker-", w), workers[w], {}});
  std::vector<int> status(W, -1);
  std::vector<double> worker_cpu_s(W, 0.0);  // user + system seconds, once reaped
  std::atomic<int> left{W};  // workers still running (the re-shard thread reads it too)
  bool soak_started = false;
  absl::Time next_sample = absl::Now();
  // Samples every live process (after the soak's first step has been reached).
  bool soak_done = false;
  FILE* samples_out = nullptr;
  if (!absl::GetFlag(FLAGS_soak_samples).empty()) {
    samples_out = fopen(absl::GetFlag(FLAGS_soak_samples).c_str(), "w");
    if (samples_out == nullptr) {
      fprintf(stderr, "cluster: cannot write --soak_samples %s: %s\n",
              absl::GetFlag(FLAGS_soak_samples).c_str(), strerror(errno));
      return 2;
    }
  }
  absl::Time soak_t0;
  auto sample = [&]() {
    if (soak_done) return;
    const std::optional<Progress> p = ReadProgress(dir + "/worker0.progress");
    if (!p) return;
    const int64_t progress = p->steps;
    if (!soak_started && progress < soak_from) return;
    if (!soak_started) soak_t0 = absl::Now();
    soak_started = true;
    // Workers that do not verify finish the last step before worker 0 reports it and
    // start tearing down (channels close, buffers are freed): not the steady state the
    // check is about, so sampling ends one step before the end.
    if (progress >= steps - 1) {
      soak_done = true;
      return;
    }
    for (SoakTrack& t : soak) {
      // Stop at the first worker's exit: the shards then close its connections and free
      // its buffers, which is not the steady state the check is about.
      if (t.pid == 0 || left < W) continue;
      absl::StatusOr<gcomp::ProcessUsage> u = gcomp::ReadProcessUsage(t.pid);
      if (!u.ok()) continue;
      t.samples.push_back(*u);
      if (samples_out != nullptr) {
        fprintf(samples_out, "%.3f\t%lld\t%s\t%llu\t%llu\n",
                absl::ToDoubleSeconds(absl::Now() - soak_t0), static_cast<long long>(progress),
                t.name.c_str(), static_cast<unsigned long long>(u->rss_bytes),
                static_cast<unsigned long long>(u->open_fds));
      }
    }
  };
  // Re-shards, one after the other, beside the monitor loop below.
  struct ReshardOutcome {
    std::string json;  // the coordinator's line, or empty
    std::string error;
  };
  std::vector<ReshardOutcome> reshards(events.size());
  // Notified once the workers are done and the launcher is about to stop the shards.
  absl::Notification stopping;
  std::thread resharder([&] {
    OutliveChildren outlive(&stopping);
    std::vector<std::string> current = shards;
    for (size_t i = 0; i < events.size(); ++i) {
      const ReshardEvent& ev = events[i];
      const int epoch = static_cast<int>(i) + 2;
      // The admin trigger fixes the switch step (--at_step), so it may come early; the file
      // one switches at the first step boundary after shard 0 sees the file, so the file
      // is rewritten one step before.
      while (trigger == "file") {
        const std::optional<Progress> p = ReadProgress(dir + "/worker0.progress");
        if ((p && p->steps >= ev.step - 1) || ev.step <= 1) break;
        if (left == 0) {
          reshards[i].error = absl::StrCat("the workers ended before step ", ev.step - 1,
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
          trigger == "file" ? config_path : absl::StrCat(dir, "/cluster-epoch", epoch, ".yaml");
      if (!write_config(next_path, next, epoch)) {
        reshards[i].error = absl::StrCat("cannot write ", next_path);
        return;
      }
      for (size_t k = current.size(); k < next.size(); ++k) {
        servers.push_back(start_shard(next_path, static_cast<int>(k), FreePort()));
      }
      if (trigger == "admin") {
        const std::string out = absl::StrCat(dir, "/reshard", i, ".json");
        std::vector<std::string> admin_args = {admin_bin, "reshard", "--config", next_path,
                                               absl::StrCat("--at_step=", ev.step),
                                               "--log_level=info"};
        if (!overrides.empty()) admin_args.push_back(set_arg);
        pid_t admin = Spawn(admin_args, out, absl::StrCat(dir, "/reshard", i, ".log"));
        int st = 0;
        waitpid(admin, &st, 0);
        reshards[i].json = std::string(absl::StripAsciiWhitespace(ReadFile(out)));
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
          reshards[i].error = absl::StrCat("gcomp_admin reshard to epoch ", epoch, ": ",
                                           std::string(absl::StripAsciiWhitespace(
                                               ReadFile(absl::StrCat(dir, "/reshard", i, ".log")))));
          return;
        }
      } else {
        // Shard 0 of the running map coordinates and logs the outcome.
        const std::string done = absl::StrCat("re-shard done: {\"from_epoch\":", epoch - 1);
        const absl::Time give_up = absl::Now() + absl::Seconds(120);
        while (reshards[i].json.empty() && absl::Now() < give_up) {
          for (size_t k = 0; k < servers.size() && reshards[i].json.empty(); ++k) {
            const std::string log = ReadFile(absl::StrCat(dir, "/shard", k, ".log"));
            const size_t at = log.find(done);
            if (at != std::string::npos) {
              const size_t begin = at + std::string("re-shard done: ").size();
              reshards[i].json = log.substr(begin, log.find('}', begin) - begin + 1);
            }
          }
          absl::SleepFor(absl::Milliseconds(50));
        }
        if (reshards[i].json.empty()) {
          reshards[i].error = absl::StrCat("the file-triggered re-shard to epoch ", epoch,
                                           " did not finish within 120 s (see the shard logs)");
          return;
        }
      }
      // Removed shards are drained: stop them (their final checkpoint would hold nothing).
      for (size_t k = next.size(); k < current.size(); ++k) {
        for (size_t s = 0; s < shards.size(); ++s) {
          if (shards[s] == current[k]) kill(servers[s], SIGTERM);
        }
      }
      for (size_t k = current.size(); k < next.size(); ++k) shards.push_back(next[k]);
      current = next;
    }
  });

  // --kill_shard: SIGKILL when worker 0 starts step --kill_at_step, maybe restart it later.
  std::string kill_error;
  std::thread killer([&] {
    OutliveChildren outlive(&stopping);
    if (kill_shards.empty()) return;
    const int at = absl::GetFlag(FLAGS_kill_at_step);
    while (true) {
      const std::optional<Progress> p = ReadProgress(dir + "/worker0.progress");
      if (p && p->steps >= at) break;
      if (left == 0) {
        kill_error = absl::StrCat("the workers ended before step ", at, ", where shards ",
                                  absl::StrJoin(kill_shards, ","), " were to be killed");
        return;
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
    for (int k : kill_shards) kill(servers[k], SIGKILL);
    const int restart_ms = absl::GetFlag(FLAGS_restart_after_ms);
    if (restart_ms < 0) return;
    absl::SleepFor(absl::Milliseconds(restart_ms));
    // Same address and index, empty memory: as a restarted pod.
    for (int k : kill_shards) {
      servers[k] = start_shard(config_path, k, metrics_ports[k]);
    }
  });

  // Workers end on their own: every call has a deadline. The launcher adds a last guard.
  const absl::Time guard = absl::Now() + absl::Seconds(60 + steps * 60);
  gcomp::ProgressMeter meter(steps, absl::Now());
  int64_t shown_steps = 0;
  gcomp::ProgressPrinter printer(stderr, gcomp::ProgressEnabled(progress_mode, STDERR_FILENO));
  std::map<pid_t, int> early_exits;  // wait status of children other than workers
  bool stopped_workers = false;      // for a shard that exited with an error
  while (left > 0) {
    if (soak_from >= 0 && absl::Now() >= next_sample) {
      sample();
      next_sample = absl::Now() + absl::Milliseconds(250);
    }
    if (printer.enabled()) {
      const std::optional<Progress> p = ReadProgress(dir + "/worker0.progress");
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
      if (std::find(workers.begin(), workers.end(), p) == workers.end()) {
        early_exits[p] = st;  // a shard (or a stray child) that ended during the run
        // A shard that exited with an error (a flag or config it refused, a checkpoint
        // folder it cannot write, a fatal error) has failed the run: its workers would
        // only wait for it up to their connect timeout or step deadline.
        bool shard = false;
        {
          absl::MutexLock lock(&logs_mu);  // `servers` grows on the re-shard thread
          shard = log_of.count(p) != 0;
        }
        if (shard && WIFEXITED(st) && WEXITSTATUS(st) != 0 && !stopped_workers) {
          stopped_workers = true;
          for (int w = 0; w < W; ++w) {
            if (status[w] == -1) kill(workers[w], SIGTERM);
          }
        }
      }
      for (int w = 0; w < W; ++w) {
        if (workers[w] == p) {
          status[w] = st;
          worker_cpu_s[w] = CpuSeconds(usage);
          --left;
          for (SoakTrack& t : soak) {
            if (t.pid == p) t.pid = 0;  // reaped: its pid may be reused
          }
        }
      }
      continue;
    }
    if (absl::Now() > guard) {
      for (int w = 0; w < W; ++w) if (status[w] == -1) kill(workers[w], SIGKILL);
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  printer.Finish();
  if (samples_out != nullptr) fclose(samples_out);
  if (absl::GetFlag(FLAGS_linger_ms) > 0) absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_linger_ms)));
  stopping.Notify();
  resharder.join();
  killer.join();
  for (pid_t s : servers) kill(s, SIGTERM);
  // CPU time of the shards running at the end (a killed one's time went with it).
  // A shard must end as asked: exit 0 at SIGTERM (after its final checkpoint), or by the
  // SIGKILL of --kill_shard. Anything else (a failed checkpoint, a crash) fails the run.
  std::vector<double> shard_cpu_s;
  std::string shard_error;
  for (size_t k = 0; k < servers.size(); ++k) {
    struct rusage usage {};
    int st = 0;
    const bool reaped = wait4(servers[k], &st, 0, &usage) == servers[k];
    shard_cpu_s.push_back(reaped ? CpuSeconds(usage) : 0.0);
    if (!reaped) {
      const auto early = early_exits.find(servers[k]);
      if (early == early_exits.end()) continue;
      st = early->second;
    }
    if (!shard_error.empty()) continue;
    std::string log;
    {
      absl::MutexLock lock(&logs_mu);
      log = log_of[servers[k]];
    }
    // SIGKILL is expected only of a --kill_shard shard that was not restarted (a restarted
    // one's pid here is the new process).
    const bool killed_here =
        std::find(kill_shards.begin(), kill_shards.end(), static_cast<int>(k)) != kill_shards.end();
    if (WIFEXITED(st) && WEXITSTATUS(st) != 0) {
      const std::string why = WhyFromLog(ReadFile(absl::StrCat(dir, "/", log)));
      shard_error = absl::StrCat("shard ", k, " exited with status ", WEXITSTATUS(st), " (see ",
                                 log, why.empty() ? "" : ": ", why, ")");
    } else if (WIFSIGNALED(st) && WTERMSIG(st) != SIGTERM &&
               !(WTERMSIG(st) == SIGKILL && killed_here)) {
      shard_error = absl::StrCat("shard ", k, " died of signal ", WTERMSIG(st), " (see ", log, ")");
    }
  }

  const WorkerResults results = ReadWorkerResults(dir, status, steps);
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
  for (const std::string& g : grads) {
    struct stat st;
    if (stat(g.c_str(), &st) == 0) grad_bytes += st.st_size - 128;  // minus the .npy header
  }
  const double gbps = p50 > 0 ? grad_bytes * W / (p50 / 1e3) / 1e9 : 0;
  bool soak_ok = true;
  std::string soak_json;
  if (soak_from >= 0) {
    soak_ok = CheckSoak(soak, soak_from, absl::GetFlag(FLAGS_soak_max_growth_pct), &soak_json,
                        &first_error);
  }
  std::string reshard_json;
  bool reshards_ok = true;
  if (!events.empty()) {
    double moved_chunks = 0, moved_bytes = 0;
    std::vector<std::string> items;
    for (size_t i = 0; i < events.size(); ++i) {
      const ReshardOutcome& r = reshards[i];
      if (r.json.empty() || !r.error.empty()) {
        reshards_ok = false;
        if (first_error.empty()) {
          first_error = r.error.empty() ? absl::StrCat("re-shard ", i + 1, " did not run") : r.error;
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
        if (first_error.empty()) {
          first_error = absl::StrFormat(
              "re-shard %d (asked for step %d) switched at step %.0f, after the last step (%d): "
              "no step ran on its map; give more --steps or an earlier STEP",
              static_cast<int>(i + 1), events[i].step, switch_step, steps - 1);
        }
      }
    }
    const bool same = digest == fixed_digest;
    if (!same && first_error.empty()) {
      first_error = absl::StrCat("results differ from the fixed-shard run (digest ", digest,
                                 " vs ", fixed_digest, ")");
    }
    reshards_ok = reshards_ok && same;
    reshard_json = absl::StrFormat(",\"reshards\":[%s],\"chunks_moved\":%.0f,\"bytes_moved\":%.0f,"
                                   "\"identical_to_fixed\":%s",
                                   absl::StrJoin(items, ","), moved_chunks, moved_bytes,
                                   same ? "true" : "false");
  }
  std::string failover_json;
  bool failover_ok = true;
  if (!kill_shards.empty()) {
    // Each failover is coordinated, and logged, by one shard.
    int failovers = 0;
    for (int k = 0; k < shard_starts.load(); ++k) {
      const std::string log = ReadFile(absl::StrCat(dir, "/shard", k, ".log"));
      for (size_t at = log.find("failover to epoch"); at != std::string::npos;
           at = log.find("failover to epoch", at + 1)) {
        ++failovers;
      }
    }
    const bool same = digest == fixed_digest;
    if (!kill_error.empty() && first_error.empty()) first_error = kill_error;
    if (!same && first_error.empty()) {
      first_error = absl::StrCat("results differ from the undisturbed run (digest ", digest,
                                 " vs ", fixed_digest, ")");
    }
    failover_ok = same && kill_error.empty();
    failover_json = absl::StrFormat(",\"failovers\":%d,\"identical_to_undisturbed\":%s",
                                    failovers, same ? "true" : "false");
  }
  // A shard that failed is most often why the workers failed: it comes first.
  if (stopped_workers) {
    // What the workers report after SIGTERM says nothing more.
    first_error = absl::StrCat(shard_error, "; the launcher stopped the workers");
  } else if (!shard_error.empty()) {
    first_error = first_error.empty() ? shard_error : absl::StrCat(shard_error, "; ", first_error);
  }
  const bool all_ok =
      ok && identical && bound_ok && soak_ok && reshards_ok && failover_ok && shard_error.empty();
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
                      etcd_members > 0 ? absl::StrCat(",\"etcd_members\":", etcd_members) : "")
             .c_str(),
         absl::StrFormat(",\"shard_cpu_s\":[%s],\"worker_cpu_s\":[%s]",
                         absl::StrJoin(shard_cpu_s, ",", FormatSeconds),
                         absl::StrJoin(worker_cpu_s, ",", FormatSeconds))
             .c_str(),
         absl::StrJoin(metrics_ports, ",").c_str(),
         digest.c_str(), Escape(first_error).c_str());
  fflush(stdout);
  if (absl::GetFlag(FLAGS_keep_logs) || !all_ok) {
    fprintf(stderr, "cluster: logs in %s\n", dir.c_str());
  } else {
    RemoveRunFolder(dir);
  }
  return all_ok ? 0 : 1;
}
