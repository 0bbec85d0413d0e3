// gcomp_admin SUBCOMMAND [flags]: operator commands against a running cluster.
//
//   gcomp_admin status --config cluster.yaml [--set k=v,...] [--json] [--timeout_ms 3000]
//   gcomp_admin checkpoint --dir DIR   (or --config: its checkpoint.dir/JOB)
//   gcomp_admin reshard --config new.yaml [--at_step N] [--deadline_ms MS]
//
// Exit status: 0 success; 1 the command ran and found a problem (e.g. a shard is down);
// 2 usage or configuration errors (unknown subcommand, bad flag, unreadable config or
// credentials). Subcommands live in one table below; a new one is a function and a row.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "admin/coordination.h"
#include "admin/status.h"
#include "base/build_info.h"
#include "base/json.h"
#include "server/checkpoint.h"
#include "base/log_flags.h"
#include "cluster/cluster_config.h"
#include "cluster/reshard_coordinator.h"
#include "coord/etcd_store.h"

ABSL_FLAG(std::string, config, "", "Cluster config file (YAML or JSON).");
ABSL_FLAG(std::vector<std::string>, set, {},
          "Config overrides, comma-separated field=value (e.g. shards=h1:7070,h2:7070).");
ABSL_FLAG(bool, json, false, "status: one JSON object instead of the table.");
ABSL_FLAG(int64_t, timeout_ms, 3000, "status: deadline of each shard's answer.");
ABSL_FLAG(std::string, dir, "",
          "checkpoint: a job's checkpoint directory (default: the config's checkpoint.dir/JOB).");
ABSL_FLAG(int64_t, at_step, 0, "reshard: switch at this step or later (0: as soon as possible).");
ABSL_FLAG(int64_t, deadline_ms, 60000,
          "reshard: how long added shards may take to come up and each shard to prepare.");
ABSL_FLAG(int64_t, finish_timeout_ms, 600000,
          "reshard: how long the switch and the chunk moves may take once committed.");

namespace {

constexpr int kExitProblem = 1;
constexpr int kExitUsage = 2;

// The config from --config and --set.
absl::StatusOr<gcomp::proto::ClusterConfig> LoadConfig() {
  if (absl::GetFlag(FLAGS_config).empty()) {
    return absl::InvalidArgumentError("--config is required");
  }
  return gcomp::cluster::LoadClusterConfig(absl::GetFlag(FLAGS_config), absl::GetFlag(FLAGS_set));
}

int Status(const std::vector<char*>& args) {
  if (args.size() > 2) {
    std::fprintf(stderr, "gcomp_admin status: unexpected argument '%s'\n", args[2]);
    return kExitUsage;
  }
  absl::StatusOr<gcomp::proto::ClusterConfig> config = LoadConfig();
  if (!config.ok()) {
    std::fprintf(stderr, "gcomp_admin status: %s\n", config.status().ToString().c_str());
    return kExitUsage;
  }
  gcomp::admin::StatusOptions options;
  options.timeout_ms = absl::GetFlag(FLAGS_timeout_ms);
  absl::StatusOr<gcomp::admin::ClusterStatus> status = gcomp::admin::CollectStatus(*config, options);
  if (!status.ok()) {
    std::fprintf(stderr, "gcomp_admin status: %s\n", status.status().ToString().c_str());
    return kExitUsage;
  }
  std::string text = absl::GetFlag(FLAGS_json) ? gcomp::admin::FormatStatusJson(*status)
                                               : gcomp::admin::FormatStatusTable(*status);
  bool healthy = status->all_up();
  if (!config->coordination().etcd().empty()) {
    // What etcd says is the one source of truth; shown with the shards' own rows.
    absl::StatusOr<gcomp::admin::CoordinationStatus> coordination =
        gcomp::admin::CollectCoordination(*config);
    healthy = healthy && coordination.ok() && coordination->healthy();
    if (absl::GetFlag(FLAGS_json)) {
      // {"shards":...,"all_up":...} gains "coordination" (or "coordination_error").
      while (!text.empty() && (text.back() == '\n' || text.back() == '}')) text.pop_back();
      text += coordination.ok()
                  ? absl::StrCat(",\"coordination\":",
                                 gcomp::admin::FormatCoordinationJson(*coordination), "}\n")
                  : absl::StrCat(",\"coordination_error\":",
                                 gcomp::JsonQuote(coordination.status().ToString()), "}\n");
    } else {
      text += coordination.ok() ? gcomp::admin::FormatCoordinationText(*coordination)
                                : absl::StrCat("etcd: ", coordination.status().ToString(), "\n");
    }
  }
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return healthy ? 0 : kExitProblem;
}

// Lists the checkpoint sets of a directory and what the newest usable one holds.
int Checkpoint(const std::vector<char*>& args) {
  if (args.size() > 2) {
    std::fprintf(stderr, "gcomp_admin checkpoint: unexpected argument '%s'\n", args[2]);
    return kExitUsage;
  }
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    absl::StatusOr<gcomp::proto::ClusterConfig> config = LoadConfig();
    if (!config.ok()) {
      std::fprintf(stderr, "gcomp_admin checkpoint: --dir or --config is required: %s\n",
                   config.status().ToString().c_str());
      return kExitUsage;
    }
    dir = gcomp::cluster::JobCheckpointDir(*config);
    if (dir.empty()) {
      std::fprintf(stderr, "gcomp_admin checkpoint: the config has no checkpoint.dir\n");
      return kExitUsage;
    }
  }
  auto [text, usable] = gcomp::server::DescribeCheckpoints(dir);
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);
  return usable ? 0 : kExitProblem;
}

// Moves the running job to the map in --config (docs/SERVICE.md, "Re-sharding"); prints
// one JSON line with the switch step and what moved.
int Reshard(const std::vector<char*>& args) {
  if (args.size() > 2) {
    std::fprintf(stderr, "gcomp_admin reshard: unexpected argument '%s'\n", args[2]);
    return kExitUsage;
  }
  absl::StatusOr<gcomp::proto::ClusterConfig> config = LoadConfig();
  if (!config.ok()) {
    std::fprintf(stderr, "gcomp_admin reshard: %s\n", config.status().ToString().c_str());
    return kExitUsage;
  }
  if (absl::GetFlag(FLAGS_at_step) < 0 || absl::GetFlag(FLAGS_deadline_ms) < 1 ||
      absl::GetFlag(FLAGS_finish_timeout_ms) < 1) {
    std::fprintf(stderr, "gcomp_admin reshard: --at_step must be >= 0, --deadline_ms and "
                         "--finish_timeout_ms >= 1\n");
    return kExitUsage;
  }
  if (!config->coordination().etcd().empty()) {
    // With etcd the coordinator drives the re-shard; this only asks and waits.
    absl::StatusOr<std::unique_ptr<gcomp::coord::EtcdStore>> store =
        gcomp::coord::EtcdStore::Create(gcomp::coord::EtcdStoreOptionsFrom(config->coordination()));
    absl::StatusOr<std::string> line =
        store.ok() ? gcomp::admin::AskForReshard(
                         store->get(), *config, absl::GetFlag(FLAGS_at_step),
                         absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms)),
                         absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms) +
                                            absl::GetFlag(FLAGS_finish_timeout_ms)))
                   : absl::StatusOr<std::string>(store.status());
    if (!line.ok()) {
      std::fprintf(stderr, "gcomp_admin reshard: %s\n", line.status().ToString().c_str());
      return kExitProblem;
    }
    std::printf("%s\n", line->c_str());
    std::fflush(stdout);
    return 0;
  }
  gcomp::cluster::ReshardOptions options;
  options.at_step = absl::GetFlag(FLAGS_at_step);
  options.deadline = absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms));
  options.finish_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_finish_timeout_ms));
  absl::StatusOr<gcomp::cluster::ReshardResult> result = gcomp::cluster::RunReshard(*config, options);
  if (!result.ok()) {
    std::fprintf(stderr, "gcomp_admin reshard: %s\n", result.status().ToString().c_str());
    return result.status().code() == absl::StatusCode::kInvalidArgument ? kExitUsage : kExitProblem;
  }
  std::printf("%s\n", result->ToJson().c_str());
  std::fflush(stdout);
  return 0;
}

struct Subcommand {
  const char* name;
  const char* summary;
  int (*run)(const std::vector<char*>& args);  // args[0] program, args[1] the subcommand
};

constexpr Subcommand kSubcommands[] = {
    {"status", "one row per shard (up, epoch, chunks, steps, bytes, ratio, memory, last error)",
     Status},
    {"checkpoint", "the checkpoint sets in --dir (or the config's checkpoint.dir/JOB) and what the "
                   "newest usable one holds; exit 1 if none is usable",
     Checkpoint},
    {"reshard", "move the running job to the shard map in --config (raise shard_map_epoch; start "
                "added shards with the new config first); prints what moved as JSON",
     Reshard},
};

std::string Usage() {
  std::string usage =
      "usage: gcomp_admin SUBCOMMAND --config FILE [--set field=value,...] [flags]\n"
      "subcommands:\n";
  for (const Subcommand& s : kSubcommands) absl::StrAppend(&usage, "  ", s.name, "  ", s.summary, "\n");
  absl::StrAppend(&usage,
                  "flags: --json, --timeout_ms N (status); --log_level, --log_format; "
                  "--helpfull lists all\n"
                  "checkpoint: --dir DIR\n"
                  "reshard: --at_step N, --deadline_ms MS, --finish_timeout_ms MS\n"
                  "exit: 0 ok, 1 a shard is down (status), no usable checkpoint (checkpoint) or "
                  "the re-shard failed (reshard), "
                  "2 usage or config error\n");
  return usage;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(Usage());
  gcomp::InstallVersionFlag("gcomp_admin");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  absl::Status logging = gcomp::InitLoggingFromFlags("gcomp_admin", "warn");
  if (!logging.ok()) {
    std::fprintf(stderr, "gcomp_admin: %s\n", logging.ToString().c_str());
    return kExitUsage;
  }
  if (args.size() < 2) {
    std::fputs(Usage().c_str(), stderr);
    return kExitUsage;
  }
  for (const Subcommand& s : kSubcommands) {
    if (std::string(args[1]) == s.name) return s.run(args);
  }
  std::fprintf(stderr, "gcomp_admin: unknown subcommand '%s'\n%s", args[1], Usage().c_str());
  return kExitUsage;
}
