// Seeded fault injection over real processes (docs/FAULTS.md): a 3-member etcd, 3
// gcomp_server processes with `replicas: 2` and `coordination.etcd`, 3 verifying workers
// (lossless + adam), and in each run one fault drawn from the seed at a drawn step:
//
//   kill_restart        SIGKILL of a shard, restarted (empty) 2 s later
//   kill_during_catchup the same, then SIGKILL again 1.5 s after the restart, while it
//                       catches up, and a second restart 2 s later
//   kill_no_restart     SIGKILL of a shard that stays down
//   pause_past_lease    SIGSTOP of a shard for 3 lease TTLs (past rpc_timeout_ms), SIGCONT;
//                       it must rejoin by itself afterwards (as after a partition)
//   kill_coordinator    SIGKILL of the shard that holds the coordinator key, restarted 2 s later
//   kill_etcd_member    SIGKILL of one etcd member of three, restarted 3 s later
//   partition_shard     a shard in its own network namespace, cut off (every packet to and
//                       from it dropped: etcd, workers, peers) for 3 lease TTLs, then healed
//
// and, only with --only (not drawn, docs/FAULTS.md says why):
//
//   kill_during_reshard a fourth shard started and a re-shard to 4 shards asked for in
//                       etcd; once the coordinator has written COMMITTED, SIGKILL of a
//                       shard, restarted 2 s later
//
// Each run's outcome: "identical" (every worker's every value equals an undisturbed run,
// bit for bit), "data_loss" (a worker got DATA_LOSS), "wrong" (finished with other values),
// or "error" (a worker failed otherwise). One fault never loses both copies, so anything
// but "identical" is a failure, except "skipped": a partition where network namespaces
// cannot be made (not root), said so in the run's detail. Prints one JSON line per run and a Markdown summary; exit
// status 0 when every run was identical.
//
//   fault_harness --server bazel-bin/server/gcomp_server --runs 30 --seed 1
#include <signal.h>
#include <sys/stat.h>

#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "admin/coordination.h"
#include "base/json.h"
#include "base/utf8.h"
#include "cluster/cluster_config.h"
#include "coord/etcd_process.h"
#include "coord/etcd_store.h"
#include "coord/map_record.h"
#include "coord/reshard_record.h"
#include "tests/free_port.h"
#include "tests/isolated_host.h"
#include "tests/shard_processes.h"

ABSL_FLAG(std::string, server, "", "gcomp_server binary (default: from the test's runfiles).");
ABSL_FLAG(int, runs, 6, "Runs, one fault each.");
ABSL_FLAG(uint32_t, seed, 1, "First run's seed; run i uses seed + i.");
ABSL_FLAG(std::string, only, "", "Draw only this fault kind (default: all kinds in turn).");
ABSL_FLAG(std::string, dir, "", "Logs of every process (default: a temporary folder).");

namespace gcomp {
namespace {

constexpr int kShards = 3;
// A run's detail in its JSON line is cut here (at a character boundary): enough for the cause.
constexpr size_t kMaxDetailBytes = 300;
constexpr int kSteps = 40;
// Steps paced so that a fault's restart and catch-up fall inside the run.
constexpr absl::Duration kStepPause = absl::Milliseconds(150);
constexpr int kLeaseTtlMs = 2000;

// Selectable with --only, never drawn.
const std::vector<std::string> kOnlyKinds = {"kill_during_reshard"};
const std::vector<std::string> kKinds = {"kill_restart",     "kill_during_catchup",
                                         "kill_no_restart",  "pause_past_lease",
                                         "kill_coordinator", "kill_etcd_member",
                                         "partition_shard"};

// `hosts`: each shard's IP address (loopback when empty).
proto::ClusterConfig Config(const std::string& job, const std::vector<std::string>& etcd,
                            const std::vector<std::string>& hosts = {}) {
  std::vector<std::string> addresses;
  for (int k = 0; k < kShards; ++k) {
    addresses.push_back(absl::StrCat(hosts.empty() ? "127.0.0.1" : hosts[k], ":",
                                     testing::FreePort()));
  }
  std::vector<std::string> set = {"workers=3", "uplink.mode=lossless", "downlink.mode=lossless",
                                  "chunk_bytes=2048", "optimizer.name=adam",
                                  "step_timeout_ms=4000", "rpc_timeout_ms=5000",
                                  "shards=" + absl::StrJoin(addresses, ","), "replicas=2"};
  if (!etcd.empty()) {
    set.push_back("coordination.etcd=" + absl::StrJoin(etcd, ","));
    set.push_back(absl::StrCat("coordination.lease_ttl_ms=", kLeaseTtlMs));
    set.push_back("coordination.request_timeout_ms=500");
  }
  absl::StatusOr<proto::ClusterConfig> c = cluster::ParseClusterConfig("job: " + job + "\n", set);
  if (!c.ok()) {
    fprintf(stderr, "fault_harness: %s\n", c.status().ToString().c_str());
    exit(2);
  }
  return *c;
}

struct RunResult {
  uint32_t seed = 0;
  std::string kind;
  int target = -1;
  int at_step = -1;
  std::string outcome;
  std::string detail;
  double seconds = 0;
  uint64_t final_epoch = 0;
};

RunResult RunOnce(uint32_t seed, const std::string& kind, const std::string& server,
                  const std::string& dir, const testing::TrainResult& reference) {
  std::mt19937 rng(seed);
  RunResult r;
  r.seed = seed;
  r.kind = kind;
  r.at_step = 2 + static_cast<int>(rng() % 6);
  r.target = static_cast<int>(rng() % kShards);
  const std::string job = absl::StrCat("run", seed);
  // A partition puts the target in a network of its own; everything else then serves on
  // this host's end of that link (loopback is not reachable from the namespace).
  std::unique_ptr<testing::IsolatedHost> isolated;
  std::vector<std::string> hosts;
  if (kind == "partition_shard") {
    absl::StatusOr<std::unique_ptr<testing::IsolatedHost>> made =
        testing::IsolatedHost::Create(static_cast<int>(seed % 64));
    if (!made.ok()) {
      r.outcome = "skipped";
      r.detail = absl::StrCat("no network namespace: ", made.status().message());
      return r;
    }
    isolated = *std::move(made);
    for (int k = 0; k < kShards; ++k) {
      hosts.push_back(k == r.target ? isolated->ns_ip() : isolated->host_ip());
    }
  }
  coord::EtcdClusterOptions eo;
  eo.members = 3;
  if (isolated != nullptr) eo.host = isolated->host_ip();
  // eo.data_dir stays empty: a temporary folder removed after the run, not kept with the
  // logs (each member preallocates a 64 MB write-ahead log).
  absl::StatusOr<std::unique_ptr<coord::EtcdCluster>> etcd = coord::EtcdCluster::Start(eo);
  if (!etcd.ok()) {
    r.outcome = "error";
    r.detail = absl::StrCat("etcd: ", etcd.status().message());
    return r;
  }
  coord::EtcdStoreOptions so;
  so.endpoints = (*etcd)->endpoints();
  std::unique_ptr<coord::EtcdStore> store = *coord::EtcdStore::Create(so);
  const proto::ClusterConfig config = Config(job, (*etcd)->endpoints(), hosts);
  testing::ShardProcesses shards(server, dir, config);
  if (isolated != nullptr) shards.SetNetns(r.target, isolated->netns_path());
  if (!shards.StartAll()) {
    r.outcome = "error";
    r.detail = "a shard did not start";
    return r;
  }
  std::thread injector;
  // kill_during_reshard: the config with a fourth shard (its own file), and the request.
  proto::ClusterConfig grown = config;
  std::unique_ptr<testing::ShardProcesses> added;
  std::thread asker;
  absl::StatusOr<std::string> reshard_line = absl::UnknownError("not asked");
  if (kind == "kill_during_reshard") {
    grown.add_shards(absl::StrCat("127.0.0.1:", testing::FreePort()));
    grown.set_shard_map_epoch(config.shard_map_epoch() + 1);
    const std::string grown_dir = absl::StrCat(dir, "/", job, "-grown");
    mkdir(grown_dir.c_str(), 0755);
    added = std::make_unique<testing::ShardProcesses>(server, grown_dir, grown);
  }
  auto inject = [&] {
    int victim = r.target;
    if (kind == "kill_coordinator") {
      absl::StatusOr<std::optional<coord::KeyValue>> who =
          store->Get(coord::JobKeys(job).coordinator);
      if (who.ok() && who->has_value() && (*who)->value.rfind("shard ", 0) == 0) {
        victim = std::stoi((*who)->value.substr(6));
      }
      r.target = victim;
    }
    if (kind == "kill_etcd_member") {
      const int member = r.target;
      (*etcd)->Kill(member);
      injector = std::thread([&, member] {
        absl::SleepFor(absl::Seconds(3));
        (*etcd)->Restart(member).IgnoreError();
      });
      return;
    }
    if (kind == "partition_shard") {
      if (absl::Status s = isolated->Cut(); !s.ok()) {
        r.detail = absl::StrCat("cutting the link: ", s.message());
        return;
      }
      injector = std::thread([&] {
        absl::SleepFor(absl::Milliseconds(3 * kLeaseTtlMs));
        isolated->Heal().IgnoreError();
      });
      return;
    }
    if (kind == "kill_during_reshard") {
      added->Start(kShards);
      asker = std::thread([&] {
        reshard_line = admin::AskForReshard(store.get(), grown, /*at_step=*/0, absl::Seconds(30),
                                            absl::Seconds(120));
      });
      injector = std::thread([&, victim] {
        // The fault lands between the decision and the end of the moves.
        const absl::Time end = absl::Now() + absl::Seconds(30);
        bool committed = false;
        while (!committed && absl::Now() < end) {
          absl::StatusOr<std::optional<coord::VersionedReshard>> rec =
              coord::ReadReshard(store.get(), job);
          committed = rec.ok() && rec->has_value() &&
                      (*rec)->record.phase() == proto::ReshardRecord::COMMITTED;
          if (!committed) absl::SleepFor(absl::Milliseconds(5));
        }
        if (!committed) {
          r.detail = "the re-shard was never seen COMMITTED";
          return;
        }
        shards.Kill(victim);
        absl::SleepFor(absl::Seconds(2));
        shards.Start(victim);
      });
      return;
    }
    if (kind == "pause_past_lease") {
      shards.Signal(victim, SIGSTOP);
      injector = std::thread([&, victim] {
        absl::SleepFor(absl::Milliseconds(3 * kLeaseTtlMs));
        shards.Signal(victim, SIGCONT);
      });
      return;
    }
    shards.Kill(victim);
    if (kind == "kill_no_restart") return;
    injector = std::thread([&, victim] {
      absl::SleepFor(absl::Seconds(2));
      shards.Start(victim);
      if (kind != "kill_during_catchup") return;
      absl::SleepFor(absl::Milliseconds(1500));
      shards.Kill(victim);
      absl::SleepFor(absl::Seconds(2));
      shards.Start(victim);
    });
  };
  testing::TrainOptions o;
  o.steps = kSteps;
  o.step_pause = kStepPause;
  o.after_step = [&](int step) {
    if (step == r.at_step) inject();
  };
  const absl::Time start = absl::Now();
  testing::TrainResult got = testing::Train(config, o);
  r.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (injector.joinable()) injector.join();
  if (asker.joinable()) asker.join();
  if (kind == "kill_during_reshard" && got.error.ok() && !reshard_line.ok()) {
    r.detail = absl::StrCat("the re-shard: ", reshard_line.status().message());
  }
  absl::StatusOr<std::optional<coord::VersionedMap>> map = coord::ReadMap(store.get(), job);
  if (map.ok() && map->has_value()) r.final_epoch = (*map)->record.epoch();
  if (!got.error.ok()) {
    r.outcome = absl::IsDataLoss(got.error) ? "data_loss" : "error";
    r.detail = absl::StrCat(r.detail, r.detail.empty() ? "" : "; ", got.error.message());
    return r;
  }
  if (!r.detail.empty()) {
    r.outcome = "error";  // the fault could not be injected as drawn
    return r;
  }
  const std::string diff = testing::FirstDifference(reference, got);
  r.outcome = diff.empty() ? "identical" : "wrong";
  r.detail = diff;
  if (diff.empty() && (kind == "partition_shard" || kind == "pause_past_lease")) {
    // A shard taken out while alive rejoins by itself once it can: the map must come back
    // to nothing down and nothing joining.
    const absl::Time end = absl::Now() + absl::Seconds(30);
    proto::ShardMapRecord record;
    while (absl::Now() < end) {
      map = coord::ReadMap(store.get(), job);
      if (map.ok() && map->has_value()) record = (*map)->record;
      if (record.down_shards_size() == 0 && record.joining_shards_size() == 0) break;
      absl::SleepFor(absl::Milliseconds(200));
    }
    r.final_epoch = record.epoch();
    if (record.down_shards_size() != 0 || record.joining_shards_size() != 0) {
      r.outcome = "error";
      r.detail = absl::StrCat("shard ", r.target, " did not rejoin within 30 s (epoch ",
                              record.epoch(), ")");
    }
  }
  return r;
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::string server = absl::GetFlag(FLAGS_server);
  if (server.empty()) {
    const char* srcdir = getenv("TEST_SRCDIR");
    server = srcdir != nullptr ? absl::StrCat(srcdir, "/gcomp_ps/server/gcomp_server")
                               : "bazel-bin/server/gcomp_server";
  }
  if (access(server.c_str(), X_OK) != 0) {
    fprintf(stderr, "fault_harness: no gcomp_server at %s (--server)\n", server.c_str());
    return 2;
  }
  const std::string only = absl::GetFlag(FLAGS_only);
  if (!only.empty() && std::find(kKinds.begin(), kKinds.end(), only) == kKinds.end() &&
      std::find(kOnlyKinds.begin(), kOnlyKinds.end(), only) == kOnlyKinds.end()) {
    fprintf(stderr, "fault_harness: --only must be one of %s, %s\n",
            absl::StrJoin(kKinds, ", ").c_str(), absl::StrJoin(kOnlyKinds, ", ").c_str());
    return 2;
  }
  std::string dir = absl::GetFlag(FLAGS_dir);
  if (dir.empty()) {
    const char* kept = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    std::string templ = kept != nullptr ? absl::StrCat(kept, "/faults-XXXXXX") : "/tmp/gcomp-faults-XXXXXX";
    dir = mkdtemp(templ.data());
  } else {
    mkdir(dir.c_str(), 0755);
  }
  testing::TrainOptions plain;
  plain.steps = kSteps;
  const testing::TrainResult reference =
      testing::TrainUndisturbed(Config("reference", {}), plain);
  if (!reference.error.ok()) {
    fprintf(stderr, "fault_harness: the undisturbed run failed: %s\n",
            reference.error.ToString().c_str());
    return 1;
  }
  std::vector<RunResult> results;
  for (int i = 0; i < absl::GetFlag(FLAGS_runs); ++i) {
    const uint32_t seed = absl::GetFlag(FLAGS_seed) + static_cast<uint32_t>(i);
    const std::string kind = only.empty() ? kKinds[seed % kKinds.size()] : only;
    RunResult r = RunOnce(seed, kind, server, dir, reference);
    printf("{\"seed\":%u,\"fault\":\"%s\",\"target\":%d,\"at_step\":%d,\"outcome\":\"%s\","
           "\"seconds\":%.1f,\"final_epoch\":%llu,\"detail\":%s}\n",
           r.seed, r.kind.c_str(), r.target, r.at_step, r.outcome.c_str(), r.seconds,
           static_cast<unsigned long long>(r.final_epoch), gcomp::JsonQuote(gcomp::Utf8Prefix(r.detail, kMaxDetailBytes)).c_str());
    fflush(stdout);
    results.push_back(r);
  }
  std::map<std::string, std::map<std::string, int>> table;
  int bad = 0;
  for (const RunResult& r : results) {
    ++table[r.kind][r.outcome];
    bad += r.outcome != "identical" && r.outcome != "skipped";
  }
  printf("\n| fault | runs | identical | data_loss | wrong | error | skipped |\n"
         "| --- | --- | --- | --- | --- | --- | --- |\n");
  for (const auto& row : table) {
    const std::map<std::string, int>& outcomes = row.second;
    int runs = 0;
    for (const auto& [o, n] : outcomes) runs += n;
    auto get = [&outcomes](const char* o) {
      auto it = outcomes.find(o);
      return it == outcomes.end() ? 0 : it->second;
    };
    printf("| %s | %d | %d | %d | %d | %d | %d |\n", row.first.c_str(), runs, get("identical"),
           get("data_loss"), get("wrong"), get("error"), get("skipped"));
  }
  printf("\n%zu runs, %d not identical (skipped ones aside); logs in %s\n", results.size(), bad,
         dir.c_str());
  return bad == 0 ? 0 : 1;
}

}  // namespace
}  // namespace gcomp

int main(int argc, char** argv) { return gcomp::Main(argc, argv); }
