// The cluster's state in etcd with real processes: a real etcd member, three gcomp_server
// processes with `replicas: 2` and `coordination.etcd`, three Clients training lossless +
// adam in threads, every result compared bit for bit with an undisturbed run. Faults the
// peer protocol alone did not survive (docs/FAULTS.md):
//   - a shard paused (SIGSTOP) past its lease and past the workers' rpc_timeout_ms: failed
//     over by its lease, the workers move on, and when it wakes it acknowledges nothing;
//   - two processes started as one shard: the second refuses to start, naming it;
//   - etcd unreachable at start: the shard refuses to start, naming the field.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cluster/cluster_config.h"
#include "coord/etcd_process.h"
#include "coord/etcd_store.h"
#include "coord/map_record.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/grpc_service.h"
#include "tests/free_port.h"
#include "tests/synthetic_gradient.h"
#include "worker/client.h"

namespace gcomp {
namespace {

constexpr int kWorkers = 3;
constexpr int kSteps = 10;
const std::vector<std::pair<std::string, size_t>> kTensors = {{"w1", 5000}, {"w2", 777}, {"b", 3}};
constexpr int kLeaseTtlMs = 2000;

using Finals = std::vector<std::vector<std::vector<float>>>;

std::string TempDir() { return getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp"; }

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

proto::ClusterConfig Config(const std::string& job, const std::vector<std::string>& etcd) {
  std::vector<std::string> addresses;
  for (int k = 0; k < 3; ++k) addresses.push_back(absl::StrCat("127.0.0.1:", testing::FreePort()));
  std::vector<std::string> set = {
      absl::StrCat("workers=", kWorkers), "uplink.mode=lossless", "downlink.mode=lossless",
      "chunk_bytes=2048", "optimizer.name=adam", "step_timeout_ms=4000",
      // Shorter than a pause of 3 lease TTLs, so that workers do wait it out.
      "rpc_timeout_ms=5000", "shards=" + absl::StrJoin(addresses, ","), "replicas=2"};
  if (!etcd.empty()) {
    set.push_back("coordination.etcd=" + absl::StrJoin(etcd, ","));
    set.push_back(absl::StrCat("coordination.lease_ttl_ms=", kLeaseTtlMs));
    set.push_back("coordination.request_timeout_ms=500");
  }
  absl::StatusOr<proto::ClusterConfig> c = cluster::ParseClusterConfig("job: " + job + "\n", set);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Trains kSteps steps with kWorkers clients; worker 0 calls after_step(step) once it has
// the results of `step`.
Finals Train(const proto::ClusterConfig& config, const std::function<void(int)>& after_step) {
  Finals finals(kWorkers);
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      worker::ClientOptions options;
      options.worker = w;
      auto client = worker::Client::Connect(config, options);
      ASSERT_TRUE(client.ok()) << client.status();
      for (size_t i = 0; i < kTensors.size(); ++i) {
        const auto& [key, n] = kTensors[i];
        std::vector<float> initial = testing::SyntheticGradient(n, 77 + i);
        ASSERT_TRUE((*client)->Declare(key, codec::DType::kF32, n, initial.data()).ok());
      }
      std::vector<std::vector<float>> out(kTensors.size());
      for (int step = 0; step < kSteps; ++step) {
        for (size_t i = 0; i < kTensors.size(); ++i) {
          const auto& [key, n] = kTensors[i];
          std::vector<float> g =
              testing::SyntheticGradient(n, static_cast<uint32_t>(1000 * step + 10 * w + i + 1));
          out[i].resize(n);
          absl::Status s = (*client)->PushPull(key, step, g.data(), out[i].data());
          ASSERT_TRUE(s.ok()) << "worker " << w << " step " << step << ": " << s;
        }
        if (w == 0 && after_step) after_step(step);
      }
      finals[w] = out;
    });
  }
  for (std::thread& t : threads) t.join();
  return finals;
}

// The same training through in-process shards that nothing disturbs (no etcd).
Finals Undisturbed() {
  const proto::ClusterConfig c = Config("reference", {});
  std::vector<std::unique_ptr<server::ShardServer>> shards;
  for (int k = 0; k < c.shards_size(); ++k) {
    auto s = server::ShardServer::Start(c, {static_cast<uint32_t>(k), 2, {}}, c.shards(k));
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    shards.push_back(*std::move(s));
  }
  return Train(c, nullptr);
}

void ExpectIdentical(const Finals& a, const Finals& b) {
  ASSERT_EQ(a.size(), b.size());
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_EQ(a[w].size(), b[w].size()) << "worker " << w;
    for (size_t i = 0; i < kTensors.size(); ++i) {
      ASSERT_EQ(a[w][i].size(), b[w][i].size());
      EXPECT_EQ(std::memcmp(a[w][i].data(), b[w][i].data(), a[w][i].size() * 4), 0)
          << "worker " << w << " tensor " << kTensors[i].first << " differs";
    }
  }
}

bool Listening(const std::string& address) {
  const size_t colon = address.rfind(':');
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
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

  void TearDown() override {
    for (pid_t pid : pids_) {
      if (pid <= 0) continue;
      kill(pid, SIGCONT);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  }

  // Starts gcomp_server as shard k of `config`; its pid (its log: shard<k>-<n>.log).
  pid_t StartShard(const proto::ClusterConfig& config, int k) {
    const std::string path = TempDir() + "/cluster-" + config.job() + ".yaml";
    std::ofstream(path) << cluster::ClusterConfigToYaml(config);
    const std::string server =
        std::string(getenv("TEST_SRCDIR")) + "/gcomp_ps/server/gcomp_server";
    // Kept with the test's outputs, for a failure's post-mortem.
    const char* kept = getenv("TEST_UNDECLARED_OUTPUTS_DIR");
    const std::string log = absl::StrCat(kept != nullptr ? kept : TempDir(), "/", config.job(),
                                         "-shard", k, "-", pids_.size(), ".log");
    logs_.push_back(log);
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      std::vector<std::string> args = {server, "--config", path, "--shard", std::to_string(k),
                                       "--metrics_address", "none", "--shutdown_grace_ms", "500"};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(server.c_str(), argv.data());
      _exit(127);
    }
    pids_.push_back(pid);
    return pid;
  }

  void StartAll(const proto::ClusterConfig& config) {
    for (int k = 0; k < config.shards_size(); ++k) StartShard(config, k);
    for (int k = 0; k < config.shards_size(); ++k) {
      const absl::Time end = absl::Now() + absl::Seconds(30);
      while (!Listening(config.shards(k)) && absl::Now() < end) absl::SleepFor(absl::Milliseconds(50));
      ASSERT_TRUE(Listening(config.shards(k))) << "shard " << k << ": " << Slurp(logs_[k]);
    }
  }

  std::unique_ptr<coord::EtcdCluster> etcd_;
  std::unique_ptr<coord::EtcdStore> store_;
  std::vector<pid_t> pids_;
  std::vector<std::string> logs_;
};

class PausedShard : public Coordination, public ::testing::WithParamInterface<int> {};

// The case that failed every worker before: a shard paused longer than rpc_timeout_ms.
// Its lease ends after lease_ttl_ms, the coordinator (elected in etcd; shard 0's pause
// pauses the coordinator itself, and another is elected) commits a map without it, the
// workers whose calls to it timed out find that map and resend, and the results are
// those of an undisturbed run. When it wakes, the shard acknowledges nothing: it is down
// in the committed map.
TEST_P(PausedShard, IsFailedOverByItsLeaseAndFencedWhenItWakes) {
  const Finals reference = Undisturbed();
  ASSERT_FALSE(reference.empty());
  const int victim = GetParam();
  const proto::ClusterConfig config = Config("paused", etcd_->endpoints());
  StartAll(config);
  std::thread resume;
  const Finals got = Train(config, [&](int step) {
    if (step != 3) return;
    kill(pids_[victim], SIGSTOP);
    resume = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(3 * kLeaseTtlMs + 3000));
      kill(pids_[victim], SIGCONT);
    });
  });
  if (resume.joinable()) resume.join();
  ExpectIdentical(reference, got);

  absl::StatusOr<std::optional<coord::VersionedMap>> map = coord::ReadMap(store_.get(), "paused");
  ASSERT_TRUE(map.ok() && map->has_value()) << map.status();
  const proto::ShardMapRecord& record = (*map)->record;
  EXPECT_GE(record.epoch(), 2u);
  EXPECT_NE(std::find(record.down_shards().begin(), record.down_shards().end(),
                      static_cast<uint32_t>(victim)),
            record.down_shards().end())
      << "shard " << victim << " not down in the committed map (epoch " << record.epoch() << ")";
  EXPECT_NE(record.written_by_shard(), victim);

  // Awake again: a push or pull is refused (here: a fresh client's registration sees the
  // map without it; the shard itself refuses to acknowledge).
  ASSERT_EQ(kill(pids_[victim], 0), 0) << "the paused shard died";
  const absl::Time end = absl::Now() + absl::Seconds(10);
  std::string log;
  while (absl::Now() < end) {
    log = Slurp(logs_[victim]);
    if (log.find("this shard is out of the map") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_NE(log.find("this shard is out of the map"), std::string::npos) << log;
}

INSTANTIATE_TEST_SUITE_P(Shards, PausedShard, ::testing::Values(0, 1));

TEST_F(Coordination, ASecondProcessStartedAsTheSameShardRefusesToStart) {
  const proto::ClusterConfig config = Config("twice", etcd_->endpoints());
  StartAll(config);
  // Same index, another port (as a second pod with the same ordinal would have).
  proto::ClusterConfig again = config;
  again.set_job("twice");
  const pid_t pid = StartShard(again, 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  pids_.back() = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  const std::string log = Slurp(logs_.back());
  EXPECT_NE(log.find("two processes were started as the same shard"), std::string::npos) << log;
}

TEST_F(Coordination, UnreachableEtcdStopsTheStartNamingTheField) {
  const proto::ClusterConfig config =
      Config("noetcd", {absl::StrCat("127.0.0.1:", testing::FreePort())});
  const pid_t pid = StartShard(config, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  pids_.back() = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  const std::string log = Slurp(logs_.back());
  EXPECT_NE(log.find("coordination.etcd"), std::string::npos) << log;
}

}  // namespace
}  // namespace gcomp
