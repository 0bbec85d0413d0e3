// gcomp_admin SUBCOMMAND [flags]: operator commands against a running cluster.
//
//   gcomp_admin status --config cluster.yaml [--set k=v,...] [--json] [--timeout_ms 3000]
//   gcomp_admin checkpoint --dir DIR   (or --config: its checkpoint.dir/JOB)
//   gcomp_admin reshard --config new.yaml [--at_step N] [--deadline_ms MS]
//
// Exit status: 0 success; 1 the command ran and found a problem (e.g. a shard is down);
// 2 usage or configuration errors (unknown subcommand, bad flag, unreadable config or
// credentials). Subcommands live in one table below; a new one is a function and a row.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "admin/coordination.h"
#include "admin/status.h"
#include "base/build_info.h"
#include "base/files.h"
#include "base/json.h"
#include "server/checkpoint.h"
#include "base/log_flags.h"
#include "base/spawn.h"
#include "cluster/cluster_config.h"
#include "cluster/config_flags.h"
#include "cluster/reshard_coordinator.h"
#include "coord/etcd_store.h"
#include "coord/map_record.h"
#include "coord/reshard_record.h"

ABSL_FLAG(bool, json, false, "status: one JSON object instead of the table.");
ABSL_FLAG(int64_t, timeout_ms, 3000, "status: deadline of each shard's answer.");
ABSL_FLAG(std::string, dir, "",
          "checkpoint: a job's checkpoint directory (default: the config's checkpoint.dir/JOB).");
ABSL_FLAG(int64_t, at_step, 0, "reshard: switch at this step or later (0: as soon as possible).");
ABSL_FLAG(int64_t, deadline_ms, 60000,
          "reshard: how long added shards may take to come up and each shard to prepare.");
ABSL_FLAG(int64_t, finish_timeout_ms, 600000,
          "reshard: how long the switch and the chunk moves may take once committed.");
ABSL_FLAG(std::string, statefulset, "",
          "scale: also scale this StatefulSet of the shards with kubectl: up before the move, "
          "down after the removed shards are drained.");
ABSL_FLAG(std::string, namespace, "", "scale: the StatefulSet's namespace (kubectl -n).");
ABSL_FLAG(std::string, kubectl, "kubectl", "scale: the kubectl to run (looked up on PATH).");

namespace {

constexpr int kExitProblem = 1;
constexpr int kExitUsage = 2;

// The config from --config and --set.
absl::StatusOr<gcomp::proto::ClusterConfig> LoadConfig() {
  if (absl::GetFlag(FLAGS_config).empty()) {
    return absl::InvalidArgumentError("--config is required");
  }
  return gcomp::cluster::LoadClusterConfigFromFlags();
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

// `kubectl scale statefulset NAME --replicas=N [-n NS]`, its output on this stderr.
absl::Status ScaleStatefulSet(uint32_t replicas) {
  std::vector<std::string> cmd = {absl::GetFlag(FLAGS_kubectl), "scale", "statefulset",
                                  absl::GetFlag(FLAGS_statefulset),
                                  absl::StrCat("--replicas=", replicas)};
  if (!absl::GetFlag(FLAGS_namespace).empty()) {
    cmd.push_back("-n");
    cmd.push_back(absl::GetFlag(FLAGS_namespace));
  }
  const pid_t pid = gcomp::Spawn(cmd, "/dev/stderr", "/dev/stderr");
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::UnavailableError(absl::StrCat("'", absl::StrJoin(cmd, " "), "' failed",
                                               WIFEXITED(status) ? absl::StrCat(" (exit ", WEXITSTATUS(status), ")") : ""));
  }
  return absl::OkStatus();
}

// One action for a change of the shard count (with coordination.etcd): the new map is the
// config file's {count, address} template at N, at the epoch after the job's committed one
// (whatever failovers raised it to), asked for in etcd; the coordinator drives the move and
// shards a re-shard adds take their map from etcd, so neither the file nor the epoch is
// edited. With --statefulset, the pods are added before the move and removed after it.
int Scale(const std::vector<char*>& args) {
  uint32_t count = 0;
  if (args.size() != 3 || !absl::SimpleAtoi(args[2], &count) || count < 1 ||
      count > static_cast<uint32_t>(gcomp::cluster::kMaxShards)) {
    std::fprintf(stderr, "gcomp_admin scale: give the shard count, 1 to %d: gcomp_admin scale N --config FILE\n",
                 gcomp::cluster::kMaxShards);
    return kExitUsage;
  }
  absl::StatusOr<gcomp::proto::ClusterConfig> config = LoadConfig();
  absl::StatusOr<std::string> text =
      config.ok() ? gcomp::ReadFile(absl::GetFlag(FLAGS_config), gcomp::cluster::kMaxClusterConfigBytes)
                  : absl::StatusOr<std::string>(config.status());
  absl::StatusOr<gcomp::proto::ClusterConfig> next =
      text.ok() ? gcomp::cluster::ScaledClusterConfig(*text, count, absl::GetFlag(FLAGS_set))
                : absl::StatusOr<gcomp::proto::ClusterConfig>(text.status());
  if (!next.ok()) {
    std::fprintf(stderr, "gcomp_admin scale: %s\n", next.status().ToString().c_str());
    return kExitUsage;
  }
  if (next->coordination().etcd().empty()) {
    std::fprintf(stderr, "gcomp_admin scale: needs coordination.etcd in the config (without it, "
                         "list the new shards, raise shard_map_epoch and run gcomp_admin reshard)\n");
    return kExitUsage;
  }
  absl::StatusOr<std::unique_ptr<gcomp::coord::EtcdStore>> store =
      gcomp::coord::EtcdStore::Create(gcomp::coord::EtcdStoreOptionsFrom(next->coordination()));
  absl::StatusOr<std::optional<gcomp::coord::VersionedMap>> map =
      store.ok() ? gcomp::coord::ReadMap(store->get(), next->job())
                 : absl::StatusOr<std::optional<gcomp::coord::VersionedMap>>(store.status());
  if (!map.ok() || !map->has_value()) {
    std::fprintf(stderr, "gcomp_admin scale: %s\n",
                 map.ok() ? "the job has no shard map in etcd yet (are its shards started?)"
                          : map.status().ToString().c_str());
    return kExitProblem;
  }
  const gcomp::proto::ShardMapRecord& running = (*map)->record;
  const uint32_t before = static_cast<uint32_t>(running.shards_size());
  if (std::equal(next->shards().begin(), next->shards().end(), running.shards().begin(),
                 running.shards().end())) {
    std::printf("{\"shards\":%u,\"epoch\":%llu,\"unchanged\":true}\n", count,
                static_cast<unsigned long long>(running.epoch()));
    return 0;
  }
  next->set_shard_map_epoch(running.epoch() + 1);
  absl::StatusOr<gcomp::coord::VersionedReshard> asked = gcomp::admin::RequestReshardTo(
      store->get(), *next, absl::GetFlag(FLAGS_at_step),
      absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms)));
  if (!asked.ok()) {
    std::fprintf(stderr, "gcomp_admin scale: %s\n", asked.status().ToString().c_str());
    return kExitProblem;
  }
  const bool kube = !absl::GetFlag(FLAGS_statefulset).empty();
  if (kube && count > before) {
    if (absl::Status s = ScaleStatefulSet(count); !s.ok()) {
      std::fprintf(stderr, "gcomp_admin scale: %s; the re-shard waits for the added shards up to "
                           "--deadline_ms, then fails and the job runs on with %u shards\n",
                   s.ToString().c_str(), before);
      return kExitProblem;
    }
  }
  absl::StatusOr<std::string> line = gcomp::admin::AwaitReshard(
      store->get(), next->job(), next->shard_map_epoch(),
      absl::Milliseconds(absl::GetFlag(FLAGS_deadline_ms) + absl::GetFlag(FLAGS_finish_timeout_ms)));
  if (!line.ok()) {
    std::fprintf(stderr, "gcomp_admin scale: %s\n", line.status().ToString().c_str());
    if (kube && count > before) {
      std::fprintf(stderr, "gcomp_admin scale: the added pods stay; scale the StatefulSet back "
                           "to %u or ask again\n", before);
    }
    return kExitProblem;
  }
  if (kube && count < before) {
    // Only now: the removed shards are drained, their chunks live on the others.
    if (absl::Status s = ScaleStatefulSet(count); !s.ok()) {
      std::fprintf(stderr, "gcomp_admin scale: the move is done, but %s; the removed shards are "
                           "drained and may be stopped by hand\n", s.ToString().c_str());
      std::printf("%s\n", line->c_str());
      return kExitProblem;
    }
  }
  std::printf("%s\n", line->c_str());
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
    {"scale", "N: move the running job to N shards of the config's {count, address} template "
              "(coordination.etcd; no edit of the file or the epoch; --statefulset adds and "
              "removes the pods around the move); prints what moved as JSON",
     Scale},
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
                  "scale N: the same, and --statefulset NAME [--namespace NS] [--kubectl PATH]\n"
                  "exit: 0 ok, 1 a shard is down (status), no usable checkpoint (checkpoint) or "
                  "the re-shard failed (reshard, scale), "
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
