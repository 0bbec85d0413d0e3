// The cluster's state in etcd with real processes: a real etcd member, three gcomp_server
// processes with `replicas: 2` and `coordination.etcd`, three Clients training lossless +
// adam in threads, every result compared bit for bit with an undisturbed run. Faults the
// peer protocol alone did not survive (docs/FAULTS.md; tests/fault_harness.cc draws more):
//   - a shard paused (SIGSTOP) past its lease and past the workers' rpc_timeout_ms: failed
//     over by its lease, the workers move on, and when it wakes it acknowledges nothing;
//   - two processes started as one shard: the second refuses to start, naming it;
//   - etcd unreachable at start: the shard refuses to start, naming the field.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cerrno>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "admin/coordination.h"
#include "cluster/cluster_config.h"
#include "coord/etcd_process.h"
#include "coord/etcd_store.h"
#include "coord/map_record.h"
#include "coord/reshard_record.h"
#include "gtest/gtest.h"
#include "tests/free_port.h"
#include "tests/shard_processes.h"

namespace gcomp {
namespace {

using testing::ShardProcesses;
using testing::Slurp;

constexpr int kLeaseTtlMs = 2000;

std::string OutDir() {
  // Kept with the test's outputs, for a failure's post-mortem.
  const char* kept = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  return kept != nullptr ? kept : getenv("TEST_TMPDIR");
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string Admin() {
  return std::string(getenv("TEST_SRCDIR")) + "/gcomp_ps/admin/gcomp_admin";
}

std::string Server() {
  return std::string(getenv("TEST_SRCDIR")) + "/gcomp_ps/server/gcomp_server";
}

// The fields of every test's config but its shards (`--set` form).
std::vector<std::string> Fields(const std::vector<std::string>& etcd) {
  std::vector<std::string> set = {
      "workers=3", "uplink.mode=lossless", "downlink.mode=lossless", "chunk_bytes=2048",
      "optimizer.name=adam", "step_timeout_ms=4000",
      // Shorter than a pause of 3 lease TTLs, so that workers do wait it out.
      "rpc_timeout_ms=5000", "replicas=2"};
  if (!etcd.empty()) {
    set.push_back("coordination.etcd=" + absl::StrJoin(etcd, ","));
    set.push_back(absl::StrCat("coordination.lease_ttl_ms=", kLeaseTtlMs));
    set.push_back("coordination.request_timeout_ms=500");
  }
  return set;
}

proto::ClusterConfig Config(const std::string& job, const std::vector<std::string>& etcd,
                            std::vector<std::string> addresses = {}) {
  if (addresses.empty()) {
    for (int k = 0; k < 3; ++k) addresses.push_back(absl::StrCat("127.0.0.1:", testing::FreePort()));
  }
  std::vector<std::string> set = Fields(etcd);
  set.push_back("shards=" + absl::StrJoin(addresses, ","));
  absl::StatusOr<proto::ClusterConfig> c = cluster::ParseClusterConfig("job: " + job + "\n", set);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

class Coordination : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<coord::EtcdCluster>> etcd = coord::EtcdCluster::Start({});
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
    coord::EtcdStoreOptions o;
    o.endpoints = etcd_->endpoints();
    store_ = *coord::EtcdStore::Create(o);
  }

  std::unique_ptr<coord::EtcdCluster> etcd_;
  std::unique_ptr<coord::EtcdStore> store_;
};

class PausedShard : public Coordination, public ::testing::WithParamInterface<int> {};

// The case that failed every worker before: a shard paused longer than rpc_timeout_ms.
// Its lease ends after lease_ttl_ms, the coordinator (elected in etcd; pausing the
// coordinator itself makes another one be elected) commits a map without it, the workers
// whose calls to it timed out find that map and resend, and the results are those of an
// undisturbed run. Awake again, the shard acknowledges nothing: it is down in the map;
// it rejoins by itself and takes its chunks back.
TEST_P(PausedShard, IsFailedOverByItsLeaseAndFencedWhenItWakes) {
  const testing::TrainResult reference = testing::TrainUndisturbed(Config("reference", {}), {});
  ASSERT_TRUE(reference.error.ok()) << reference.error;
  const int victim = GetParam();
  ShardProcesses shards(Server(), OutDir(), Config(absl::StrCat("paused", victim), etcd_->endpoints()));
  ASSERT_TRUE(shards.StartAll());
  std::thread resume;
  testing::TrainOptions o;
  o.after_step = [&](int step) {
    if (step != 3) return;
    shards.Signal(victim, SIGSTOP);
    resume = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(3 * kLeaseTtlMs + 3000));
      shards.Signal(victim, SIGCONT);
    });
  };
  const testing::TrainResult got = testing::Train(shards.config(), o);
  if (resume.joinable()) resume.join();
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(testing::FirstDifference(reference, got), "");

  // Another shard failed it over.
  std::string others;
  for (int k = 0; k < 3; ++k) {
    if (k != victim) others += Slurp(shards.log(k));
  }
  EXPECT_NE(others.find(absl::StrCat("(down: [", victim, "])")), std::string::npos) << others;

  // Awake, it learns it is out of the map, and comes back by itself: it rejoins, catches
  // up and takes its chunks back (nothing down or joining in the record again).
  ASSERT_EQ(kill(shards.pid(victim), 0), 0) << "the paused shard died";
  const absl::Time end = absl::Now() + absl::Seconds(30);
  std::string log;
  proto::ShardMapRecord record;
  bool back = false;
  while (absl::Now() < end && !back) {
    log = Slurp(shards.log(victim));
    absl::StatusOr<std::optional<coord::VersionedMap>> map =
        coord::ReadMap(store_.get(), shards.config().job());
    if (map.ok() && map->has_value()) record = (*map)->record;
    back = log.find("this shard is out of the map") != std::string::npos &&
           record.epoch() >= 4 && record.down_shards_size() == 0 &&
           record.joining_shards_size() == 0;
    if (!back) absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_NE(log.find("this shard is out of the map"), std::string::npos) << log;
  EXPECT_NE(log.find("rejoining"), std::string::npos) << log;
  EXPECT_TRUE(back) << "epoch " << record.epoch() << ", down " << record.down_shards_size()
                    << ", joining " << record.joining_shards_size() << "\n" << log;
}

INSTANTIATE_TEST_SUITE_P(Shards, PausedShard, ::testing::Values(0, 1));

// Two shards that share chunks die one map apart (their leases ended in different ticks
// of the coordinator): shard 2 first, failed over (shard 0 becomes a new, still empty
// backup of the chunks shard 1 and 2 held), then shard 1 before any step synced that
// backup. The chunks are lost, and the error names both shards whose copies were lost, not
// only the last one (CI once saw "every copy of its state was on shard 1").
TEST_F(Coordination, TwoShardsLostOneMapApartAreBothNamed) {
  ShardProcesses shards(Server(), OutDir(), Config("apart", etcd_->endpoints()));
  ASSERT_TRUE(shards.StartAll());
  const std::string job = shards.config().job();
  testing::TrainOptions o;
  o.after_step = [&](int step) {
    if (step != 3) return;
    shards.Kill(2);
    const absl::Time end = absl::Now() + absl::Milliseconds(kLeaseTtlMs) + absl::Seconds(10);
    bool failed_over = false;
    while (!failed_over && absl::Now() < end) {
      absl::StatusOr<std::optional<coord::VersionedMap>> map = coord::ReadMap(store_.get(), job);
      failed_over = map.ok() && map->has_value() && (*map)->record.down_shards_size() == 1;
      if (!failed_over) absl::SleepFor(absl::Milliseconds(50));
    }
    EXPECT_TRUE(failed_over) << "no map with shard 2 down";
    // Every shard installs a committed map from its watch; give them that moment.
    absl::SleepFor(absl::Milliseconds(500));
    shards.Kill(1);
  };
  const testing::TrainResult got = testing::Train(shards.config(), o);
  ASSERT_FALSE(got.error.ok());
  EXPECT_TRUE(absl::IsDataLoss(got.error)) << got.error;
  const std::string message(got.error.message());
  EXPECT_NE(message.find("shard 1 ("), std::string::npos) << message;
  EXPECT_NE(message.find("shard 2 ("), std::string::npos) << message;
}

// `replicas: 2` with checkpoints, the whole job stopped (SIGTERM: each shard writes its
// final set) and started again: with the peer protocol every shard took the others for a
// running job and waited to rejoin it, so the job never served again. From etcd's run
// record, the first shard up starts run 2 and names the set; the others enter it and
// restore the same set; training resumes from step 5 and ends bit-identical to a run that
// was never stopped. Stopped and started a second time, the same holds (run 3), even with
// a shard killed before the first step after the restore: its backups restored their
// copies from the set too, so the failover loses nothing.
TEST_F(Coordination, AWholeJobRestartedFromCheckpointsServes) {
  testing::TrainOptions all;
  all.steps = 9;
  const testing::TrainResult reference = testing::TrainUndisturbed(Config("reference", {}), all);
  ASSERT_TRUE(reference.error.ok()) << reference.error;
  proto::ClusterConfig c = Config("restart", etcd_->endpoints());
  c.mutable_checkpoint()->set_dir(absl::StrCat(getenv("TEST_TMPDIR"), "/ckpt-restart"));
  c.mutable_checkpoint()->set_every_steps(2);
  ShardProcesses shards(Server(), OutDir(), c);
  testing::TrainResult got;
  int generation = 1;
  for (const auto& [first, last] : {std::pair{0, 5}, std::pair{5, 7}, std::pair{7, 9}}) {
    ASSERT_TRUE(shards.StartAll());
    testing::TrainOptions part;
    part.first_step = first;
    part.steps = last;
    const int killed = first == 7 ? 1 : -1;
    if (killed >= 0) shards.Kill(killed);
    got = testing::Train(shards.config(), part);
    ASSERT_TRUE(got.error.ok()) << "steps " << first << " to " << last - 1 << ": " << got.error;
    std::string logs;
    for (int k = 0; k < 3; ++k) logs += Slurp(shards.log(k));
    if (killed >= 0) {
      EXPECT_EQ(CountOf(logs, "0 chunks taken over, 0 lost"), 0) << logs;
      EXPECT_EQ(CountOf(logs, "lost: every copy"), 0) << logs;
    }
    // One shard started the run, the others entered it; every one restored the same set.
    const std::string run = absl::StrCat(" run ", generation, " of job restart");
    EXPECT_EQ(CountOf(logs, "started the" + run), 1) << logs;
    EXPECT_EQ(CountOf(logs, "entered the" + run), 2) << logs;
    if (first > 0) {
      EXPECT_EQ(CountOf(logs, "restores final-of-3"), 3) << logs;
    }
    for (int k = 0; k < 3; ++k) {
      if (k == killed) continue;
      const int status = shards.Stop(k);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "shard " << k << ": " << status;
    }
    ++generation;
  }
  EXPECT_EQ(testing::FirstDifference(reference, got), "");
}

// A re-shard with etcd: asked for in the job's re-shard record (what gcomp_admin reshard
// does), driven by the elected coordinator, which writes the switch step into the record
// before any shard switches and moves the committed map record to the new map at the end.
// Training goes on through it and ends bit-identical to an undisturbed run.
TEST_F(Coordination, AReshardAskedForInEtcdIsDrivenByTheCoordinator) {
  testing::TrainOptions o;
  o.steps = 12;
  const testing::TrainResult reference = testing::TrainUndisturbed(Config("reference", {}), o);
  ASSERT_TRUE(reference.error.ok()) << reference.error;
  const proto::ClusterConfig config = Config("grow", etcd_->endpoints());
  ShardProcesses shards(Server(), OutDir(), config);
  ASSERT_TRUE(shards.StartAll());
  proto::ClusterConfig grown = config;
  grown.add_shards(absl::StrCat("127.0.0.1:", testing::FreePort()));
  grown.set_shard_map_epoch(config.shard_map_epoch() + 1);
  // The added shard starts with the new config, from a file of its own: the others' file
  // stays as it is, so only the request asks for the re-shard.
  const std::string grown_dir = OutDir() + "/grown";
  ASSERT_EQ(mkdir(grown_dir.c_str(), 0755) == 0 || errno == EEXIST, true);
  ShardProcesses added(Server(), grown_dir, grown);
  std::thread asker;
  absl::StatusOr<std::string> line = absl::UnknownError("not asked");
  proto::ReshardRecord committed;
  o.after_step = [&](int step) {
    if (step != 3) return;
    added.Start(3);
    asker = std::thread([&] {
      line = admin::AskForReshard(store_.get(), grown, /*at_step=*/0, absl::Seconds(30),
                                  absl::Seconds(120));
    });
    // Worker 0 holds the next step until the decision is in the record, so that the switch
    // lands while the workers still train (the steps after it wait for the switch anyway).
    const absl::Time end = absl::Now() + absl::Seconds(60);
    while (absl::Now() < end) {
      absl::StatusOr<std::optional<coord::VersionedReshard>> r =
          coord::ReadReshard(store_.get(), "grow");
      if (r.ok() && r->has_value() && (*r)->record.phase() != proto::ReshardRecord::REQUESTED) {
        committed = (*r)->record;
        return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  };
  const testing::TrainResult got = testing::Train(config, o);
  if (asker.joinable()) asker.join();
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(testing::FirstDifference(reference, got), "");
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_NE(line->find("\"to_shards\":4"), std::string::npos) << *line;

  // Decided by the coordinator before the switch: COMMITTED past the steps started then.
  EXPECT_EQ(committed.phase(), proto::ReshardRecord::COMMITTED) << committed.ShortDebugString();
  EXPECT_GT(committed.switch_step(), 3);
  EXPECT_EQ(committed.from().shards_size(), 3);
  absl::StatusOr<std::optional<coord::VersionedReshard>> done =
      coord::ReadReshard(store_.get(), "grow");
  ASSERT_TRUE(done.ok() && done->has_value());
  EXPECT_EQ((*done)->record.phase(), proto::ReshardRecord::DONE);
  EXPECT_EQ((*done)->record.switch_step(), committed.switch_step());
  EXPECT_EQ((*done)->record.result_json(), *line);
  EXPECT_EQ((*done)->record.decided_by().rfind("shard ", 0), 0u) << (*done)->record.decided_by();
  // The committed map record is the new map: failover and restarts start from it.
  absl::StatusOr<std::optional<coord::VersionedMap>> map = coord::ReadMap(store_.get(), "grow");
  ASSERT_TRUE(map.ok() && map->has_value());
  EXPECT_EQ((*map)->record.epoch(), grown.shard_map_epoch());
  EXPECT_EQ((*map)->record.shards_size(), 4);
  // Asking again for the epoch done is the same request: nothing happens twice.
  absl::StatusOr<std::string> again =
      admin::AskForReshard(store_.get(), grown, 0, absl::Seconds(1), absl::Seconds(5));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *line);
}
// `fields` (Fields()' form) as a config file, with `shards` as given (YAML).
std::string YamlOf(const std::string& job, const std::vector<std::string>& fields,
                   const std::string& shards) {
  std::string out = absl::StrCat("job: ", job, "\nshards: ", shards, "\n");
  std::map<std::string, std::vector<std::string>> nested;
  for (const std::string& f : fields) {
    const size_t eq = f.find('='), dot = f.find('.');
    const std::string key = f.substr(0, eq), value = absl::StrCat("\"", f.substr(eq + 1), "\"");
    if (dot < eq) {
      nested[key.substr(0, dot)].push_back(absl::StrCat(key.substr(dot + 1), ": ", value));
    } else {
      absl::StrAppend(&out, key, ": ", value, "\n");
    }
  }
  for (const auto& [section, entries] : nested) {
    absl::StrAppend(&out, section, ": {", absl::StrJoin(entries, ", "), "}\n");
  }
  return out;
}

// Runs `command`; its exit status and standard output.
std::pair<int, std::string> RunCommand(const std::string& command) {
  FILE* p = popen(command.c_str(), "r");
  std::string out;
  char buf[4096];
  while (p != nullptr && fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int status = p != nullptr ? pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

// Scaling in one step: `gcomp_admin scale 4` against a config file of the
// {count, address} form. Nobody edits the file the shards read or raises an epoch: the
// added shard starts from the unchanged file (count 3) and takes its map from the request
// in etcd; the re-shard is driven by the coordinator; training goes on bit-identical.
// Afterwards a shard killed and restarted from that same unchanged file takes the
// committed map from etcd and rejoins, and training goes on, still bit-identical.
TEST_F(Coordination, ScalingIsOneCommandAndTheUnchangedFileStillServes) {
  testing::TrainOptions all;
  all.steps = 14;
  const testing::TrainResult reference = testing::TrainUndisturbed(Config("reference", {}), all);
  ASSERT_TRUE(reference.error.ok()) << reference.error;
  const int port = testing::FreePort();
  std::vector<std::string> addresses;
  for (int k = 0; k < 4; ++k) addresses.push_back(absl::StrCat("127.0.", k, ".1:", port));
  const std::vector<std::string> three(addresses.begin(), addresses.begin() + 3);
  const proto::ClusterConfig config = Config("scale", etcd_->endpoints(), three);
  ShardProcesses shards(Server(), OutDir(), config);
  ASSERT_TRUE(shards.StartAll());
  const std::string admin_yaml = OutDir() + "/scale-admin.yaml";
  std::ofstream(admin_yaml) << YamlOf("scale", Fields(etcd_->endpoints()),
                                      absl::StrCat("{count: 3, address: \"127.0.{index}.1:", port, "\"}"));
  // The fourth shard's process, started from the file of three shards.
  proto::ClusterConfig four = config;
  four.add_shards(addresses[3]);
  const std::string pod_dir = OutDir() + "/scale-pod3";
  ASSERT_EQ(mkdir(pod_dir.c_str(), 0755) == 0 || errno == EEXIST, true);
  ShardProcesses pod3(Server(), pod_dir, four);
  pod3.WriteConfigFile(config);

  // kubectl as a script that notes its arguments (no Kubernetes here); the test starts the
  // pod itself.
  const std::string kubectl = OutDir() + "/scale-kubectl.sh";
  const std::string kubectl_calls = OutDir() + "/scale-kubectl.calls";
  std::ofstream(kubectl) << "#!/bin/sh\necho \"$*\" >> " << kubectl_calls << "\n";
  ASSERT_EQ(chmod(kubectl.c_str(), 0755), 0);
  std::thread admin;
  std::pair<int, std::string> scaled = {-1, ""};
  testing::TrainOptions first = all;
  first.steps = 10;
  first.after_step = [&](int step) {
    if (step != 3) return;
    admin = std::thread([&] {
      scaled = RunCommand(absl::StrCat(Admin(), " scale 4 --config ", admin_yaml,
                                       " --deadline_ms 30000 --statefulset gcomp-shard --namespace ml",
                                       " --kubectl ", kubectl, " 2>", OutDir(), "/scale-admin.log"));
    });
    // As `kubectl scale` would, once the request is in: the pod of shard 3 comes up.
    const absl::Time end = absl::Now() + absl::Seconds(60);
    bool asked = false;
    while (absl::Now() < end) {
      absl::StatusOr<std::optional<coord::VersionedReshard>> r =
          coord::ReadReshard(store_.get(), "scale");
      if (r.ok() && r->has_value()) {
        if (!asked) pod3.Start(3);
        asked = true;
        if ((*r)->record.phase() != proto::ReshardRecord::REQUESTED) return;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
  };
  testing::TrainResult got = testing::Train(config, first);
  if (admin.joinable()) admin.join();
  ASSERT_TRUE(got.error.ok()) << got.error;
  EXPECT_EQ(scaled.first, 0) << scaled.second << Slurp(OutDir() + "/scale-admin.log");
  EXPECT_NE(scaled.second.find("\"to_shards\":4"), std::string::npos) << scaled.second;
  EXPECT_NE(scaled.second.find("\"to_epoch\":2"), std::string::npos) << scaled.second;
  // The StatefulSet grew once, after the request was in etcd (the pod finds it there).
  EXPECT_EQ(Slurp(kubectl_calls), "scale statefulset gcomp-shard --replicas=4 -n ml\n");
  EXPECT_NE(Slurp(pod3.log(3)).find("adds this shard: starting with its map of 4 shards"),
            std::string::npos)
      << Slurp(pod3.log(3));
  absl::StatusOr<std::optional<coord::VersionedMap>> map = coord::ReadMap(store_.get(), "scale");
  ASSERT_TRUE(map.ok() && map->has_value());
  EXPECT_EQ((*map)->record.shards_size(), 4);
  // Asking for the count the job has is no re-shard.
  const std::pair<int, std::string> same =
      RunCommand(absl::StrCat(Admin(), " scale 4 --config ", admin_yaml, " 2>/dev/null"));
  EXPECT_EQ(same.first, 0);
  EXPECT_NE(same.second.find("\"unchanged\":true"), std::string::npos) << same.second;

  // Shard 3 dies and comes back from the same unchanged file: it takes the committed map,
  // is failed over and taken back, and the job trains on.
  pod3.Kill(3);
  pod3.Start(3);
  testing::TrainOptions rest = all;
  rest.first_step = 10;
  const testing::TrainResult after = testing::Train(config, rest);
  ASSERT_TRUE(after.error.ok()) << after.error;
  EXPECT_EQ(testing::FirstDifference(reference, after), "");
  EXPECT_NE(Slurp(pod3.log(3)).find("starting with the map in etcd"), std::string::npos)
      << Slurp(pod3.log(3));
}


TEST_F(Coordination, ASecondProcessStartedAsTheSameShardRefusesToStart) {
  ShardProcesses shards(Server(), OutDir(), Config("twice", etcd_->endpoints()));
  ASSERT_TRUE(shards.StartAll());
  const auto [pid, log] = shards.StartDuplicate(1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  const std::string text = Slurp(log);
  EXPECT_NE(text.find("two processes were started as the same shard"), std::string::npos) << text;
}

TEST_F(Coordination, UnreachableEtcdStopsTheStartNamingTheField) {
  ShardProcesses shards(Server(), OutDir(),
                        Config("noetcd", {absl::StrCat("127.0.0.1:", testing::FreePort())}));
  const pid_t pid = shards.Start(0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  const std::string text = Slurp(shards.log(0));
  EXPECT_NE(text.find("coordination.etcd"), std::string::npos) << text;
}

}  // namespace
}  // namespace gcomp
