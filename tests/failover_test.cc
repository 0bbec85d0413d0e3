// Replication and failover over real gRPC on loopback: in-process shards (ShardServer) with
// `replicas: 2`, Clients training in threads, and a shard stopped mid-run. The process test
// (failover_process_test.sh) does the same with SIGKILL.
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "cluster/cluster_config.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/reshard.grpc.pb.h"
#include "server/grpc_service.h"
#include "tests/free_port.h"
#include "tests/synthetic_gradient.h"
#include "worker/client.h"

namespace gcomp {
namespace {

using ::testing::HasSubstr;

using testing::FreePort;

constexpr int kWorkers = 3;
constexpr int kSteps = 10;
const std::vector<std::pair<std::string, size_t>> kTensors = {{"w1", 5000}, {"w2", 777}, {"b", 3}};

proto::ClusterConfig Config(int shards, int replicas, const std::string& optimizer) {
  std::vector<std::string> addresses;
  for (int k = 0; k < shards; ++k) addresses.push_back(absl::StrCat("127.0.0.1:", FreePort()));
  absl::StatusOr<proto::ClusterConfig> c = cluster::ParseClusterConfig(
      "job: failover\n",
      {absl::StrCat("workers=", kWorkers), "uplink.mode=lossless", "downlink.mode=lossless",
       "chunk_bytes=2048", "optimizer.name=" + optimizer, "step_timeout_ms=10000",
       "rpc_timeout_ms=20000", "shards=" + absl::StrJoin(addresses, ","),
       absl::StrCat("replicas=", replicas)});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<std::unique_ptr<server::ShardServer>> StartShards(const proto::ClusterConfig& c) {
  std::vector<std::unique_ptr<server::ShardServer>> shards;
  for (int k = 0; k < c.shards_size(); ++k) {
    auto s = server::ShardServer::Start(c, {static_cast<uint32_t>(k), 2, {}}, c.shards(k));
    EXPECT_TRUE(s.ok()) << s.status();
    shards.push_back(s.ok() ? *std::move(s) : nullptr);
  }
  return shards;
}

// Trains kSteps steps with kWorkers clients; worker 0 calls after_step(step) once it has
// the results of `step`. Every worker's final values, tensor by tensor.
std::vector<std::vector<std::vector<float>>> Train(const proto::ClusterConfig& config,
                                                   const std::function<void(int)>& after_step,
                                                   uint64_t* down_reports) {
  std::vector<std::vector<std::vector<float>>> finals(kWorkers);
  std::atomic<uint64_t> reports{0};
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
      reports += (*client)->stats().down_reports;
    });
  }
  for (std::thread& t : threads) t.join();
  if (down_reports != nullptr) *down_reports = reports;
  return finals;
}

proto::ReshardStatusResponse StatusOf(const std::string& address) {
  auto stub = proto::Resharding::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  proto::ReshardStatusResponse r;
  EXPECT_TRUE(stub->ReshardStatus(&ctx, proto::ReshardStatusRequest(), &r).ok());
  return r;
}

void ExpectIdentical(const std::vector<std::vector<std::vector<float>>>& a,
                     const std::vector<std::vector<std::vector<float>>>& b) {
  for (int w = 0; w < kWorkers; ++w) {
    for (size_t i = 0; i < kTensors.size(); ++i) {
      ASSERT_EQ(a[w][i].size(), b[w][i].size());
      EXPECT_EQ(std::memcmp(a[w][i].data(), b[w][i].data(), a[w][i].size() * 4), 0)
          << "worker " << w << " tensor " << kTensors[i].first << " differs";
    }
  }
}

class Failover : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// 3 shards, replicas 2, 3 workers: shard K stops after step 4; its chunks' backups take
// over and every worker ends bit-identical to an undisturbed run (and to one without
// replicas: replication changes no result).
TEST_P(Failover, AStoppedShardLosesNoAcknowledgedStep) {
  const std::string optimizer = std::get<0>(GetParam());
  const int killed = std::get<1>(GetParam());
  std::vector<std::vector<std::vector<float>>> undisturbed, unreplicated;
  {
    const proto::ClusterConfig c = Config(3, 1, optimizer);
    auto shards = StartShards(c);
    unreplicated = Train(c, nullptr, nullptr);
  }
  {
    const proto::ClusterConfig c = Config(3, 2, optimizer);
    auto shards = StartShards(c);
    undisturbed = Train(c, nullptr, nullptr);
  }
  ExpectIdentical(undisturbed, unreplicated);
  const proto::ClusterConfig c = Config(3, 2, optimizer);
  auto shards = StartShards(c);
  uint64_t reports = 0;
  auto disturbed = Train(c, [&](int step) { if (step == 4) shards[killed].reset(); }, &reports);
  ExpectIdentical(disturbed, undisturbed);
  EXPECT_GE(reports, 1u);
  const int live = killed == 0 ? 1 : 0;
  const proto::ReshardStatusResponse st = StatusOf(c.shards(live));
  EXPECT_TRUE(st.degraded());
  EXPECT_THAT(std::vector<uint32_t>(st.down_shards().begin(), st.down_shards().end()),
              ::testing::ElementsAre(static_cast<uint32_t>(killed)));
  EXPECT_EQ(st.shard_map_epoch(), 2u);
  EXPECT_EQ(st.chunks_lost(), 0u);
  // Operators see it in the metrics too.
  const std::string metrics = shards[live]->service()->metrics()->Text();
  EXPECT_THAT(metrics, HasSubstr("gcomp_shard_replication_degraded{gcomp_job=\"failover\",shard=\""));
  EXPECT_THAT(metrics, ::testing::ContainsRegex("gcomp_shard_replication_degraded\\{[^}]*\\} 1"));
  EXPECT_THAT(metrics, ::testing::ContainsRegex("gcomp_shard_down_shards\\{[^}]*\\} 1"));
}

// The same, with the stopped shard started again 300 ms later (same address and index,
// empty memory, as a restarted pod): it catches up from the current owners and takes its
// chunks back while the workers train.
TEST_P(Failover, ARestartedShardRejoinsAndTakesItsChunksBack) {
  const std::string optimizer = std::get<0>(GetParam());
  const int killed = std::get<1>(GetParam());
  std::vector<std::vector<std::vector<float>>> undisturbed;
  {
    const proto::ClusterConfig c = Config(3, 2, optimizer);
    auto shards = StartShards(c);
    undisturbed = Train(c, nullptr, nullptr);
  }
  const proto::ClusterConfig c = Config(3, 2, optimizer);
  auto shards = StartShards(c);
  std::thread restarter;
  auto disturbed = Train(c, [&](int step) {
    if (step != 3) return;
    shards[killed].reset();
    restarter = std::thread([&] {
      absl::SleepFor(absl::Milliseconds(300));
      auto s = server::ShardServer::Start(c, {static_cast<uint32_t>(killed), 2, {}}, c.shards(killed));
      ASSERT_TRUE(s.ok()) << s.status();
      shards[killed] = *std::move(s);
    });
  }, nullptr);
  restarter.join();
  ExpectIdentical(disturbed, undisturbed);
  // Back in the map: nothing down, nothing joining, its chunks its own again.
  const proto::ReshardStatusResponse st = StatusOf(c.shards(killed));
  EXPECT_EQ(st.state(), "serving");
  EXPECT_EQ(st.down_shards_size(), 0);
  EXPECT_EQ(st.joining_shards_size(), 0);
  EXPECT_FALSE(st.degraded());
  EXPECT_GT(st.chunks_promoted(), 0u);
  EXPECT_GT(st.chunks_owned(), 0u);
}

INSTANTIATE_TEST_SUITE_P(OptimizersAndShards, Failover,
                         ::testing::Combine(::testing::Values("momentum", "adam"),
                                            ::testing::Values(0, 1, 2)));

// The one worker of `one`, connected, with tensor "t" (kOneWorkerElements: 64 chunks, some
// held by shards 1 and 2 only) declared and `g` pushed as step 0; null after a failure.
constexpr size_t kOneWorkerElements = 64 * 512;
std::unique_ptr<worker::Client> OneWorkerAfterAStep(const proto::ClusterConfig& one,
                                                    const std::vector<float>& g,
                                                    std::vector<float>* out) {
  auto w = worker::Client::Connect(one, worker::ClientOptions());
  EXPECT_TRUE(w.ok()) << w.status();
  if (!w.ok()) return nullptr;
  absl::Status s = (*w)->Declare("t", codec::DType::kF32, kOneWorkerElements);
  if (s.ok()) s = (*w)->PushPull("t", 0, g.data(), out->data());
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? *std::move(w) : nullptr;
}

// A tensor declared without initial values, its owner stopped before any step: the backup
// takes over a chunk that has no value yet (zeros until its first step) and sends that
// state to the chunk's new backup. A state without a value was once refused as
// "incomplete" and the step failed after its retries (UNAVAILABLE "replicating step -1").
TEST(FailoverErrors, AChunkWithoutValueYetFailsOverAndReplicates) {
  for (const char* optimizer : {"none", "sgd", "adam"}) {
    proto::ClusterConfig one = Config(3, 2, optimizer);
    one.set_workers(1);
    auto shards = StartShards(one);
    auto w = worker::Client::Connect(one, worker::ClientOptions());
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Declare("t", codec::DType::kF32, kOneWorkerElements).ok());
    shards[1].reset();
    std::vector<float> g(kOneWorkerElements, 1.0f), out(kOneWorkerElements);
    for (int step = 0; step < 2; ++step) {
      absl::Status s = (*w)->PushPull("t", step, g.data(), out.data());
      ASSERT_TRUE(s.ok()) << optimizer << " step " << step << ": " << s;
    }
    EXPECT_GT(StatusOf(one.shards(0)).chunks_promoted() + StatusOf(one.shards(2)).chunks_promoted(),
              0u);
  }
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& address,
                                                            const std::string& service) {
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  const grpc::Status s =
      grpc::health::v1::Health::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))
          ->Check(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.status();
}

// Readiness is honest: a shard that does not serve training calls (here one started with
// `replicas: 2` while its peers do not answer: it cannot tell a fresh job from a running
// one, so it holds as a restarted shard) answers NOT_SERVING for the Aggregation service,
// which the readiness probe asks, and SERVING for "" (liveness: the process is fine). Once
// its peers answer and no job runs, it serves and is ready.
TEST(Readiness, AShardThatDoesNotServeIsNotReady) {
  using grpc::health::v1::HealthCheckResponse;
  const proto::ClusterConfig c = Config(3, 2, "none");
  std::vector<std::unique_ptr<server::ShardServer>> shards(3);
  auto one = server::ShardServer::Start(c, {1, 2, {}}, c.shards(1));
  ASSERT_TRUE(one.ok()) << one.status();
  shards[1] = *std::move(one);
  const std::string aggregation = proto::Aggregation::service_full_name();
  EXPECT_EQ(Health(c.shards(1), ""), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(c.shards(1), aggregation), HealthCheckResponse::NOT_SERVING);
  absl::SleepFor(absl::Seconds(1));  // still held: nothing changed
  EXPECT_EQ(Health(c.shards(1), aggregation), HealthCheckResponse::NOT_SERVING);
  for (uint32_t k : {0u, 2u}) {
    auto s = server::ShardServer::Start(c, {k, 2, {}}, c.shards(k));
    ASSERT_TRUE(s.ok()) << s.status();
    shards[k] = *std::move(s);
  }
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (absl::Now() < end && Health(c.shards(1), aggregation) != HealthCheckResponse::SERVING) {
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(Health(c.shards(1), aggregation), HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(c.shards(0), aggregation), HealthCheckResponse::SERVING);
  // At shutdown every service reads NOT_SERVING (gRPC's own rule) until the port closes.
  shards[1]->Shutdown(absl::Seconds(1));
}

// Both shards that hold some chunk stop at once: that chunk's next step fails with a status
// naming both; nothing is silently wrong.
TEST(FailoverErrors, TwoCopiesDownAtOnceFailNamingBothShards) {
  proto::ClusterConfig one = Config(3, 2, "sgd");
  one.set_workers(1);
  auto solo = StartShards(one);
  std::vector<float> g(kOneWorkerElements, 1.0f), out(kOneWorkerElements);
  std::unique_ptr<worker::Client> w = OneWorkerAfterAStep(one, g, &out);
  ASSERT_NE(w, nullptr);
  solo[1].reset();
  solo[2].reset();
  absl::Status s = w->PushPull("t", 1, g.data(), out.data());
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(one.shards(1)));
  EXPECT_THAT(std::string(s.message()), HasSubstr(one.shards(2)));
  const proto::ReshardStatusResponse st = StatusOf(one.shards(0));
  EXPECT_GT(st.chunks_lost(), 0u);
  EXPECT_GT(st.chunks_promoted(), 0u);
}

// A Rejoin names the shard to take back; the coordinator asks that shard first. One from a
// caller naming a live shard (anyone holding the job token could send it) changes nothing,
// where it once marked the shard down and, for two shards, lost the chunks they held.
TEST(FailoverErrors, ARejoinForALiveShardIsRefused) {
  proto::ClusterConfig one = Config(3, 2, "none");
  one.set_workers(1);
  auto shards = StartShards(one);
  std::vector<float> g(kOneWorkerElements, 1.0f), out(kOneWorkerElements);
  std::unique_ptr<worker::Client> w = OneWorkerAfterAStep(one, g, &out);
  ASSERT_NE(w, nullptr);
  auto stub = proto::Resharding::NewStub(
      grpc::CreateChannel(one.shards(0), grpc::InsecureChannelCredentials()));
  for (uint32_t k : {1u, 2u}) {
    proto::RejoinRequest r;
    r.set_job("failover");
    r.set_shard(k);
    proto::RejoinResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->Rejoin(&ctx, r, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << s.error_message();
    EXPECT_THAT(s.error_message(),
                HasSubstr(absl::StrCat("shard ", k, " did not restart (it reports 'serving')")));
  }
  const proto::ReshardStatusResponse st = StatusOf(one.shards(0));
  EXPECT_EQ(st.shard_map_epoch(), 1u);
  EXPECT_EQ(st.down_shards_size(), 0);
  EXPECT_EQ(st.joining_shards_size(), 0);
  EXPECT_EQ(st.chunks_lost(), 0u);
  ASSERT_TRUE(w->PushPull("t", 1, g.data(), out.data()).ok());
  EXPECT_EQ(out, g);
}

// InstallMap is the failover coordinator's call: a map sent in the name of a shard that
// is not a live shard of it, or with an epoch near the top of its range (the next
// failover's epoch + 1 would wrap), is refused and changes nothing.
TEST(FailoverErrors, AnInstallThatNoLiveShardCouldSendIsRefused) {
  proto::ClusterConfig one = Config(3, 2, "none");
  one.set_workers(1);
  auto shards = StartShards(one);
  std::vector<float> g(kOneWorkerElements, 1.0f), out(kOneWorkerElements);
  std::unique_ptr<worker::Client> w = OneWorkerAfterAStep(one, g, &out);
  ASSERT_NE(w, nullptr);
  auto stub = proto::Resharding::NewStub(
      grpc::CreateChannel(one.shards(0), grpc::InsecureChannelCredentials()));
  struct Case {
    uint32_t from_shard;
    uint64_t epoch;
    const char* message;
    bool all_joining = false;  // every shard listed as joining instead of shard 1 down
  };
  const Case cases[] = {{1, 2, "from_shard 1 is not a live shard"},
                        {7, 2, "from_shard 7 is not a live shard"},
                        {0, 2, "from_shard 0 is not a live shard", true},
                        {2, uint64_t{1} << 62, "below 2^62"},
                        {2, ~uint64_t{0}, "below 2^62"}};
  for (const Case& c : cases) {
    proto::InstallMapRequest r;
    *r.mutable_map() = one;
    r.mutable_map()->set_shard_map_epoch(c.epoch);
    if (c.all_joining) {
      for (uint32_t k = 0; k < 3; ++k) r.mutable_map()->add_joining_shards(k);
    } else {
      r.mutable_map()->add_down_shards(1);
    }
    r.set_from_shard(c.from_shard);
    proto::InstallMapResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = stub->InstallMap(&ctx, r, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(c.message));
  }
  const proto::ReshardStatusResponse st = StatusOf(one.shards(0));
  EXPECT_EQ(st.shard_map_epoch(), 1u);
  EXPECT_EQ(st.down_shards_size(), 0);
  ASSERT_TRUE(w->PushPull("t", 1, g.data(), out.data()).ok());
  EXPECT_EQ(out, g);
}

}  // namespace
}  // namespace gcomp
