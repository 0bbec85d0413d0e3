// gcomp_server --config FILE --shard K [--set field=value ...] [--decode_threads N]
// Serves shard K of the cluster described by FILE until SIGTERM or SIGINT, then shuts
// down gracefully (waiting steps end with UNAVAILABLE, in-flight calls drain), then, with
// `checkpoint.dir` configured, writes the final checkpoint.
#include <signal.h>

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/malloc_tuning.h"
#include "base/metrics_exposer.h"
#include "prometheus/registry.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "server/grpc_service.h"

ABSL_FLAG(std::string, config, "", "Cluster config file (YAML or JSON).");
ABSL_FLAG(int, shard, -1, "This process's shard index into the config's `shards` list.");
ABSL_FLAG(std::vector<std::string>, set, {},
          "Config overrides, comma-separated field=value (e.g. workers=4,uplink.mode=none).");
ABSL_FLAG(std::string, listen, "",
          "Listen address; default: the shard's address from the config.");
ABSL_FLAG(int, decode_threads, 4, "Threads that decode and sum pushed blocks.");
ABSL_FLAG(int, shutdown_grace_ms, 5000, "How long in-flight calls may drain on SIGTERM.");
ABSL_FLAG(std::string, log_level, "info", "trace|debug|info|warn|error|off");
ABSL_FLAG(std::string, log_format, "text", gcomp::kLogFormatHelp);
ABSL_FLAG(std::string, metrics_address, "0.0.0.0:9464",
          "Serve Prometheus metrics on http://ADDRESS/metrics (port 0 picks a free port, "
          "logged at start); 'none' turns them off.");

int main(int argc, char** argv) {
  gcomp::TuneMallocForLargeBuffers();
  const gcomp::PeriodicMallocTrim trim_heap(absl::Seconds(5));
  absl::ParseCommandLine(argc, argv);
  const int shard = absl::GetFlag(FLAGS_shard);
  absl::Status s = gcomp::InitLogging(absl::StrCat("gcomp_server[", shard, "]"),
                                      absl::GetFlag(FLAGS_log_level),
                                      absl::GetFlag(FLAGS_log_format));
  if (!s.ok()) {
    fprintf(stderr, "%s\n", s.ToString().c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_config).empty() || shard < 0) {
    gcomp::log::Error("--config and --shard are required");
    return 2;
  }
  absl::StatusOr<gcomp::proto::ClusterConfig> config =
      gcomp::cluster::LoadClusterConfig(absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_set));
  if (!config.ok()) {
    gcomp::log::Error("{}", config.status().ToString());
    return 2;
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
  // Block the signals before any thread starts so that only sigwait() below sees them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

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
  gcomp::log::Info("shard {} of {} listening on {} (port {}), job '{}', {} workers, epoch {}",
                   shard, config->shards_size(), listen, (*server)->port(), config->job(),
                   config->workers(), config->shard_map_epoch());
  std::unique_ptr<gcomp::MetricsExposer> metrics;
  if (absl::GetFlag(FLAGS_metrics_address) != "none") {
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
  int sig = 0;
  sigwait(&signals, &sig);
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
