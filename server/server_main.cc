// gcomp_server --config FILE --shard K [--set field=value ...] [--decode_threads N]
// Serves shard K of the cluster described by FILE until SIGTERM or SIGINT, then shuts
// down gracefully (waiting steps end with UNAVAILABLE, in-flight calls drain), then, with
// `checkpoint.dir` configured, writes the final checkpoint.
//
// The config file is watched (--config_poll_ms): when it changes to a higher
// shard_map_epoch (e.g. a Kubernetes ConfigMap edited to add or remove shards), shard 0 of
// the running map coordinates the live re-shard; with coordination.etcd the file only asks
// for it in etcd and the elected coordinator drives it (docs/SERVICE.md, "Re-sharding").
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/build_info.h"
#include "base/build_info_metric.h"
#include "base/files.h"
#include "base/log_flags.h"
#include "base/logging.h"
#include "base/malloc_tuning.h"
#include "base/metrics_exposer.h"
#include "base/mutex_mode.h"
#include "cluster/cluster_config.h"
#include "cluster/config_flags.h"
#include "cluster/credentials.h"
#include "cluster/reshard_coordinator.h"
#include "coord/reshard_record.h"
#include "prometheus/registry.h"
#include "server/cluster_state.h"
#include "server/grpc_service.h"
#include "server/library_logs.h"
#include "server/reshard_driver.h"

ABSL_FLAG(int, shard, -1, "This process's shard index into the config's `shards` list.");
ABSL_FLAG(bool, shard_from_hostname, false,
          "Take the shard index from the host name's trailing -N (a StatefulSet pod's "
          "ordinal, e.g. gcomp-shard-2) instead of --shard.");
ABSL_FLAG(std::string, listen, "",
          "Listen address; default: the shard's address from the config.");
ABSL_FLAG(int, decode_threads, 4, "Threads that decode and sum pushed blocks.");
ABSL_FLAG(int, shutdown_grace_ms, 5000, "How long in-flight calls may drain on SIGTERM.");
ABSL_FLAG(int, config_poll_ms, 2000,
          "How often the config file is re-read for a re-shard (0: never).");
ABSL_FLAG(int, reshard_deadline_ms, 60000,
          "File-triggered re-shard: how long added shards may take to come up.");
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9464",
          "Serve Prometheus metrics on http://ADDRESS/metrics (port 0 picks a free port, "
          "logged at start); 'none' turns them off.");

ABSL_FLAG(bool, exit_with_parent, false,
          "Shut down as on SIGTERM when the process that started this one exits (for "
          "launchers such as Python's LocalCluster, whose shards would otherwise outlive a "
          "crashed parent).");
ABSL_FLAG(int64_t, parent_pid, 0,
          "With --exit_with_parent: the process id of the launcher. A shard whose parent is "
          "already another process when it starts (the launcher died before the shard's main "
          "ran) shuts down at once. 0: whatever process is the parent at start.");

namespace {

// Re-reads `path` every `poll` until `stop`; a valid config of a higher epoch makes shard 0
// of the running map run the re-shard. A file that does not load is logged once per
// content and changes nothing; a failed re-shard is retried at most once a minute.
// The watcher's hand-over with main at shutdown: main stops it, and joins it unless it is
// inside a re-shard (which can take minutes); a detached watcher touches nothing after.
struct WatchState {
  absl::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;
  bool in_reshard ABSL_GUARDED_BY(mu) = false;
};

void WatchConfig(const std::string& path, const std::vector<std::string>& overrides,
                 gcomp::server::ShardService* service, gcomp::server::ClusterState* cluster_state,
                 absl::Duration poll, absl::Duration deadline, WatchState* state) {
  std::string last_content;
  absl::Time last_attempt = absl::InfinitePast();
  while (true) {
    {
      absl::MutexLock lock(&state->mu);
      auto stopped = [state]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->stop; };
      if (state->mu.AwaitWithTimeout(absl::Condition(&stopped), poll)) return;
    }
    absl::StatusOr<std::string> content =
        gcomp::ReadFile(path, gcomp::cluster::kMaxClusterConfigBytes);
    if (!content.ok()) continue;  // mid-swap, or gone: try again next time
    const bool changed = *content != last_content;
    last_content = *content;
    absl::StatusOr<gcomp::proto::ClusterConfig> next =
        gcomp::cluster::LoadClusterConfig(path, overrides);
    if (!next.ok()) {
      if (changed) gcomp::log::Error("config file {} changed but is not valid, ignored: {}", path, next.status().ToString());
      continue;
    }
    const gcomp::proto::ClusterConfig now = service->CurrentConfig();
    if (next->shard_map_epoch() <= now.shard_map_epoch()) {
      const bool same_shards = std::equal(next->shards().begin(), next->shards().end(),
                                          now.shards().begin(), now.shards().end());
      if (changed && !same_shards) {
        gcomp::log::Error("config file {} lists other shards but shard_map_epoch {} is not above "
                          "the running {}; ignored (raise it to re-shard)",
                          path, next->shard_map_epoch(), now.shard_map_epoch());
      }
      continue;
    }
    if (cluster_state == nullptr && service->shard() != 0) {
      if (changed) gcomp::log::Info("config file now has epoch {}; shard 0 coordinates the re-shard", next->shard_map_epoch());
      continue;
    }
    if (!changed && absl::Now() - last_attempt < absl::Minutes(1)) continue;
    last_attempt = absl::Now();
    if (cluster_state != nullptr) {
      // With etcd the file only asks; the coordinator drives (server/reshard_driver.h). A
      // request of the epoch already asked for is the same request; a failed one is asked
      // for again at most once a minute.
      gcomp::proto::ReshardRecord request;
      request.set_phase(gcomp::proto::ReshardRecord::REQUESTED);
      *request.mutable_next() = *next;
      request.mutable_next()->clear_security();
      request.set_deadline_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(deadline)));
      request.set_requested_unix_ms(absl::ToUnixMillis(absl::Now()));
      absl::StatusOr<gcomp::coord::VersionedReshard> asked = cluster_state->RequestReshard(request);
      if (asked.ok()) {
        if (changed) {
          gcomp::log::Info("config file {} now has epoch {} ({} shards): re-shard {} in etcd",
                           path, next->shard_map_epoch(), next->shards_size(),
                           gcomp::coord::PhaseName(asked->record.phase()));
        }
      } else {
        gcomp::log::Error("config file {} asks for epoch {}, but the re-shard could not be asked "
                          "for: {}", path, next->shard_map_epoch(), asked.status().ToString());
      }
      continue;
    }
    gcomp::cluster::ReshardOptions options;
    options.deadline = deadline;
    gcomp::log::Info("config file {} now has epoch {} ({} shards): coordinating the re-shard",
                     path, next->shard_map_epoch(), next->shards_size());
    {
      absl::MutexLock lock(&state->mu);
      if (state->stop) return;
      state->in_reshard = true;
    }
    absl::StatusOr<gcomp::cluster::ReshardResult> result = gcomp::cluster::RunReshard(*next, options);
    {
      absl::MutexLock lock(&state->mu);
      state->in_reshard = false;
      if (state->stop) return;
    }
    if (result.ok()) {
      gcomp::log::Info("re-shard done: {}", result->ToJson());
    } else {
      gcomp::log::Error("re-shard to epoch {} failed: {}", next->shard_map_epoch(), result.status().ToString());
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const pid_t parent_at_start = getppid();  // for --exit_with_parent, read first
  // Block the signals before any thread starts (PeriodicMallocTrim's is the first), so that
  // only sigwait() below sees them. A thread that did not block SIGTERM took one that came
  // before main reached sigwait, and its default action ended the process (exit 143, no
  // drain, no final checkpoint); now such a signal waits for sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  gcomp::TuneMallocForLargeBuffers();
  gcomp::DisableMutexDeadlockDetection();
  const gcomp::PeriodicMallocTrim trim_heap(absl::Seconds(5));
  absl::SetProgramUsageMessage(
      "gcomp_server --config FILE --shard K [--set field=value,...] [--decode_threads N]\n"
      "Serves shard K of the cluster in FILE (docs/SERVICE.md); --helpfull lists every flag.");
  gcomp::InstallVersionFlag("gcomp_server");
  absl::ParseCommandLine(argc, argv);
  int shard = absl::GetFlag(FLAGS_shard);
  if (shard < -1) {  // -1, the default, means "not given"
    fprintf(stderr, "gcomp_server: --shard must be a shard index (0 or more), got %d\n", shard);
    return 2;
  }
  if (absl::GetFlag(FLAGS_shard_from_hostname)) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    absl::StatusOr<uint32_t> from_host = gcomp::cluster::ShardFromPodName(host);
    if (!from_host.ok() || (shard >= 0 && static_cast<uint32_t>(shard) != *from_host)) {
      fprintf(stderr, "gcomp_server: %s\n",
              from_host.ok() ? "--shard and --shard_from_hostname disagree"
                             : from_host.status().ToString().c_str());
      return 2;
    }
    shard = static_cast<int>(*from_host);
  }
  const int64_t parent_pid = absl::GetFlag(FLAGS_parent_pid);
  if (parent_pid < 0 || parent_pid > std::numeric_limits<pid_t>::max() ||
      (parent_pid != 0 && !absl::GetFlag(FLAGS_exit_with_parent))) {
    fprintf(stderr,
            "gcomp_server: --parent_pid must be a process id (1 or more) and comes with "
            "--exit_with_parent, got %lld\n",
            static_cast<long long>(parent_pid));
    return 2;
  }
  absl::Status s = gcomp::InitLoggingFromFlags(absl::StrCat("gcomp_server[", shard, "]"), "info");
  if (!s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  gcomp::server::RouteLibraryLogs();
  if (absl::GetFlag(FLAGS_config).empty() || shard < 0) {
    gcomp::log::Error("--config and --shard (or --shard_from_hostname) are required");
    return 2;
  }
  absl::StatusOr<gcomp::proto::ClusterConfig> config = gcomp::cluster::LoadClusterConfigFromFlags();
  if (!config.ok()) {
    gcomp::log::Error("{}", config.status().ToString());
    return 2;
  }
  if (!config->coordination().etcd().empty()) {
    // The job's map in etcd may list other shards than the file (gcomp_admin scale).
    absl::StatusOr<gcomp::proto::ClusterConfig> in_etcd =
        gcomp::server::ClusterState::WithJobMap(*config, static_cast<uint32_t>(shard));
    if (!in_etcd.ok()) {
      gcomp::log::Error("coordination.etcd: {}", in_etcd.status().ToString());
      return absl::IsFailedPrecondition(in_etcd.status()) ? 2 : 1;
    }
    config = *std::move(in_etcd);
  }
  if (shard >= config->shards_size()) {
    gcomp::log::Error("--shard {} out of range: the config lists {} shards", shard,
                      config->shards_size());
    return 2;
  }
  // The first line a running shard logs says how it is protected (docs/SERVICE.md,
  // "Security"), so that a plaintext shard cannot go unnoticed.
  const bool tls = !config->security().ca_file().empty();
  if (tls) {
    gcomp::log::Info("security: {}", gcomp::cluster::DescribeSecurity(*config));
  } else {
    gcomp::log::Warn("security: {}", gcomp::cluster::DescribeSecurity(*config));
  }
  // Every connection holds a file descriptor. The shard's listener refuses connections
  // past limits.max_connections, and past the soft open-file limit less a reserve for the
  // shard itself (server/listener.h); the soft limit (often 1024) is raised to the hard one
  // so that the configured cap is the one that applies.
  struct rlimit files;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &files) != 0) {
      gcomp::log::Warn("cannot raise the open-file limit to {}", files.rlim_max);
    }
  }
  const uint64_t max_connections = gcomp::server::TransportLimitsFor(*config).max_connections;
  const rlim_t reserve = gcomp::server::ListenerOptions().reserve_fds;
  if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
      files.rlim_cur < max_connections + reserve) {
    gcomp::log::Warn(
        "open-file limit {}: this shard holds at most about {} connections, fewer than "
        "limits.max_connections = {} (raise it: ulimit -n, or the container runtime's "
        "nofile limit)",
        files.rlim_cur, files.rlim_cur > reserve ? files.rlim_cur - reserve : 0, max_connections);
  }
  gcomp::server::ShardOptions options;
  options.shard = static_cast<uint32_t>(shard);
  options.decode_threads = absl::GetFlag(FLAGS_decode_threads);
  std::string listen = absl::GetFlag(FLAGS_listen);
  if (listen.empty()) listen = config->shards(shard);
  absl::StatusOr<std::unique_ptr<gcomp::server::ShardServer>> server =
      gcomp::server::ShardServer::Start(*config, options, listen);
  if (!server.ok()) {
    gcomp::log::Error("{}", server.status().ToString());
    return 1;
  }
  gcomp::log::Info(
      "shard {} of {} listening on {} (port {}), job '{}', {} workers, epoch {}, at most {} "
      "connections; {}",
      shard, config->shards_size(), listen, (*server)->port(), config->job(), config->workers(),
      config->shard_map_epoch(), max_connections, gcomp::VersionLine("gcomp_server"));
  std::unique_ptr<gcomp::MetricsExposer> metrics;
  if (absl::GetFlag(FLAGS_metrics_address) != "none") {
    gcomp::RegisterBuildInfo(*(*server)->service()->metrics()->registry());
    absl::StatusOr<std::unique_ptr<gcomp::MetricsExposer>> exposer = gcomp::MetricsExposer::Start(
        absl::GetFlag(FLAGS_metrics_address), (*server)->service()->metrics()->registry());
    if (!exposer.ok()) {
      gcomp::log::Error("{} (set --metrics_address, or 'none')", exposer.status().ToString());
      return 2;
    }
    metrics = *std::move(exposer);
    gcomp::log::Info("shard {}: metrics on http://{}/metrics (port {})", shard,
                     absl::GetFlag(FLAGS_metrics_address), metrics->port());
  }
  // With etcd, whoever coordinates drives the job's re-shards (asked for by the admin or a
  // shard's config file).
  std::unique_ptr<gcomp::server::ReshardDriver> reshard_driver;
  if ((*server)->cluster_state() != nullptr) {
    gcomp::server::ReshardDriverOptions options;
    options.on_pending = [metrics = (*server)->service()->metrics()](bool pending) {
      metrics->SetReshardRequested(pending);
    };
    reshard_driver = std::make_unique<gcomp::server::ReshardDriver>((*server)->cluster_state(),
                                                                    *config, options);
  }
  auto* watch = new WatchState();  // leaked on purpose: a detached watcher may still read it
  std::thread watcher;
  if (absl::GetFlag(FLAGS_config_poll_ms) > 0) {
    watcher = std::thread(WatchConfig, absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_set),
                          (*server)->service(), (*server)->cluster_state(),
                          absl::Milliseconds(absl::GetFlag(FLAGS_config_poll_ms)),
                          absl::Milliseconds(absl::GetFlag(FLAGS_reshard_deadline_ms)), watch);
  }
  if (absl::GetFlag(FLAGS_exit_with_parent)) {
    // Polled rather than prctl(PR_SET_PDEATHSIG), which fires when the parent's forking
    // thread ends, not the parent. A parent gone after main() began is seen within 200 ms;
    // one gone before it (between fork and main) is seen only when --parent_pid names it.
    const pid_t parent = parent_pid > 0 ? static_cast<pid_t>(parent_pid) : parent_at_start;
    std::thread([parent]() {
      while (getppid() == parent) absl::SleepFor(absl::Milliseconds(200));
      gcomp::log::Warn("the process that started this shard ({}) exited: shutting down", parent);
      kill(getpid(), SIGTERM);
    }).detach();
  }
  int sig = 0;
  sigwait(&signals, &sig);
  reshard_driver.reset();
  if (watcher.joinable()) {
    bool busy = false;
    {
      absl::MutexLock lock(&watch->mu);
      watch->stop = true;
      busy = watch->in_reshard;
    }
    if (busy) {
      watcher.detach();
    } else {
      watcher.join();
    }
  }
  gcomp::log::Info("shard {}: signal {}, shutting down", shard, sig);
  (*server)->Shutdown(absl::Milliseconds(absl::GetFlag(FLAGS_shutdown_grace_ms)));
  int rc = 0;
  if (!config->checkpoint().dir().empty()) {
    // After the drain: every chunk is at its last completed step (docs/CHECKPOINT.md).
    absl::Status written = (*server)->service()->WriteFinalCheckpoint();
    if (!written.ok()) {
      gcomp::log::Error("shard {}: final checkpoint failed: {}", shard, written.ToString());
      rc = 1;
    }
  }
  gcomp::proto::StatsResponse stats;
  (*server)->service()->Stats(&stats);
  gcomp::log::Info("shard {}: stopped; pushes {} duplicates {} rejected {} steps {} failed {}",
                   shard, stats.pushes(), stats.duplicate_pushes(), stats.rejected_pushes(),
                   stats.steps_completed(), stats.steps_failed());
  return rc;
}
