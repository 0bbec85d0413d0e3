// Live re-sharding over real gRPC on loopback: in-process shards (ShardServer), Clients
// training in threads, and the coordinator (cluster/reshard_coordinator.h) moving the job
// between maps while they run.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "cluster/cluster_config.h"
#include "cluster/grpc_status.h"
#include "cluster/reshard_coordinator.h"
#include "cluster/shard_map.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
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
constexpr int kSteps = 12;
const std::vector<std::pair<std::string, size_t>> kTensors = {{"w1", 5000}, {"w2", 777}, {"b", 3}};

// The config of a map of `addresses` at `epoch`.
proto::ClusterConfig Config(const std::vector<std::string>& addresses, uint64_t epoch,
                            const std::string& optimizer, int replicas = 1) {
  absl::StatusOr<proto::ClusterConfig> c = cluster::ParseClusterConfig(
      "job: reshard\n", {absl::StrCat("workers=", kWorkers), "uplink.mode=lossless",
                         "downlink.mode=lossless", "chunk_bytes=2048", "optimizer.name=" + optimizer,
                         "step_timeout_ms=10000", "rpc_timeout_ms=20000",
                         "shards=" + absl::StrJoin(addresses, ","),
                         absl::StrCat("shard_map_epoch=", epoch),
                         absl::StrCat("replicas=", replicas)});
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::unique_ptr<server::ShardServer> StartShard(const proto::ClusterConfig& config, uint32_t k) {
  auto s = server::ShardServer::Start(config, {k, 2, {}}, config.shards(k));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

// Worker w's gradient of `key` at `step`.
std::vector<float> Gradient(size_t n, int w, int step, size_t salt) {
  return testing::SyntheticGradient(n, static_cast<uint32_t>(1000 * step + 10 * w + salt + 1));
}

// Runs body(w, client) for every worker w on a thread of its own, with a connected Client.
void OnWorkers(const proto::ClusterConfig& config,
               const std::function<void(int, worker::Client&)>& body) {
  std::vector<std::thread> threads;
  for (int w = 0; w < kWorkers; ++w) {
    threads.emplace_back([&, w] {
      worker::ClientOptions options;
      options.worker = w;
      auto client = worker::Client::Connect(config, options);
      ASSERT_TRUE(client.ok()) << client.status();
      body(w, **client);
    });
  }
  for (std::thread& t : threads) t.join();
}

// Trains kSteps steps with kWorkers clients. Returns every worker's final values, tensor by
// tensor, and adds up the clients' map switches. `reached`, if given, counts each worker
// into reached[step] as it starts the step; `open`, if given, holds each worker before a
// step until open[step] is true.
std::vector<std::vector<std::vector<float>>> Train(const proto::ClusterConfig& config,
                                                   uint64_t* map_switches,
                                                   std::atomic<int>* reached = nullptr,
                                                   std::atomic<bool>* open = nullptr) {
  std::vector<std::vector<std::vector<float>>> finals(kWorkers);
  std::atomic<uint64_t> switches{0};
  OnWorkers(config, [&](int w, worker::Client& client) {
    for (size_t i = 0; i < kTensors.size(); ++i) {
      const auto& [key, n] = kTensors[i];
      std::vector<float> initial = testing::SyntheticGradient(n, 77 + i);
      ASSERT_TRUE(client.Declare(key, codec::DType::kF32, n, initial.data()).ok());
    }
    std::vector<std::vector<float>> out(kTensors.size());
    for (int step = 0; step < kSteps; ++step) {
      while (open != nullptr && !open[step].load()) absl::SleepFor(absl::Milliseconds(1));
      if (reached != nullptr) ++reached[step];
      for (size_t i = 0; i < kTensors.size(); ++i) {
        const auto& [key, n] = kTensors[i];
        std::vector<float> g = Gradient(n, w, step, i);
        out[i].resize(n);
        absl::Status s = client.PushPull(key, step, g.data(), out[i].data());
        ASSERT_TRUE(s.ok()) << "worker " << w << " step " << step << ": " << s;
      }
    }
    finals[w] = out;
    switches += client.stats().map_switches;
  });
  if (map_switches != nullptr) *map_switches = switches;
  return finals;
}

// kWorkers clients push ones into tensor "t" of n elements for steps [first, steps); each
// must succeed.
void PushOnes(const proto::ClusterConfig& config, size_t n, int steps, int first = 0) {
  OnWorkers(config, [&](int w, worker::Client& client) {
    ASSERT_TRUE(client.Declare("t", codec::DType::kF32, n).ok());
    std::vector<float> g(n, 1.0f), out(n);
    for (int step = first; step < steps; ++step) {
      absl::Status s = client.PushPull("t", step, g.data(), out.data());
      EXPECT_TRUE(s.ok()) << "worker " << w << " step " << step << ": " << s;
    }
  });
}

// (optimizer, replicas): re-sharding a replicated job moves the owners' chunks, and the
// new backups fill from the owners' next states.
class Reshard : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// 2 -> 3 shards at step 4 and 3 -> 2 at step 8 while 3 workers train: every worker ends
// with values bit-identical to the same run on 2 fixed shards.
TEST_P(Reshard, TwoToThreeToTwoIsBitIdenticalToFixedShards) {
  const std::string optimizer = std::get<0>(GetParam());
  const int replicas = std::get<1>(GetParam());
  std::vector<std::vector<std::vector<float>>> fixed;
  {
    const proto::ClusterConfig c = Config({absl::StrCat("127.0.0.1:", FreePort()),
                                           absl::StrCat("127.0.0.1:", FreePort())}, 1, optimizer, replicas);
    auto s0 = StartShard(c, 0), s1 = StartShard(c, 1);
    fixed = Train(c, nullptr);
  }
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const std::string b = absl::StrCat("127.0.0.1:", FreePort());
  const std::string extra = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig two = Config({a, b}, 1, optimizer, replicas);
  const proto::ClusterConfig three = Config({a, b, extra}, 2, optimizer, replicas);
  const proto::ClusterConfig back = Config({a, b}, 3, optimizer, replicas);
  auto s0 = StartShard(two, 0), s1 = StartShard(two, 1);
  std::unique_ptr<server::ShardServer> s2;
  std::vector<cluster::ReshardResult> results;
  std::atomic<int> reached[kSteps] = {};
  // Workers wait before the step ahead of each switch step until its re-shard is committed.
  // The switch is at least at_step and past every step a chunk may have started, which
  // counts a chunk's next step once the one before has completed (its pushes may be on their
  // way): workers that had finished step at_step - 1 by the Prepare would move the switch a
  // step later.
  std::atomic<bool> open[kSteps];
  for (int step = 0; step < kSteps; ++step) open[step] = step != 3 && step != 7;
  // Runs the re-shard to `config` switching at `at_step` beside the held workers; lets them
  // on once every shard of `old_shards` has the commit.
  auto reshard = [&](const proto::ClusterConfig& config, int64_t at_step,
                     const std::vector<server::ShardServer*>& old_shards) {
    cluster::ReshardOptions o;
    o.at_step = at_step;
    absl::StatusOr<cluster::ReshardResult> r;
    std::thread coordinator([&] { r = cluster::RunReshard(config, o); });
    const absl::Time give_up = absl::Now() + absl::Minutes(2);  // the re-shard failed
    for (server::ShardServer* shard : old_shards) {
      while (absl::Now() < give_up) {
        proto::ReshardStatusResponse status;
        shard->service()->ReshardStatus(&status);
        if (status.state() == "committed" ||
            status.shard_map_epoch() >= config.shard_map_epoch()) break;
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
    open[at_step - 1] = true;
    coordinator.join();
    ASSERT_TRUE(r.ok()) << r.status();
    results.push_back(*r);
  };
  // The coordinator runs beside the workers (a re-shard blocks until it is done, and the
  // switch waits for the workers to reach it).
  uint64_t switches = 0;
  std::vector<std::vector<std::vector<float>>> moved;
  std::thread trainer([&] { moved = Train(two, &switches, reached, open); });
  s2 = StartShard(three, 2);  // the added shard starts with the new config
  reshard(three, 4, {s0.get(), s1.get()});
  // Once every worker is on the first re-shard's map: a worker still on the map before it
  // when the second one commits can take the second map for its own and wait for a switch
  // that waits for it (docs/SERVICE.md, "Re-sharding", limits).
  const absl::Time give_up = absl::Now() + absl::Minutes(2);  // a worker failed
  while (reached[5].load() < kWorkers && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  reshard(back, 8, {s0.get(), s1.get(), s2.get()});
  // Every chunk-step the drained shard completes came before the switch.
  const auto steps_completed = [](server::ShardServer* shard) {
    proto::StatsResponse stats;
    shard->service()->Stats(&stats);
    return stats.steps_completed();
  };
  const uint64_t drained_steps = steps_completed(s2.get());
  // Drained: stopped at once. A worker that still has an old-map push for it finds the new
  // map through the other shards.
  s2.reset();
  trainer.join();
  // Each chunk completes each step once, on whichever shard owned it then: the shards'
  // counts add up to that through both re-shards (chunks moved away took theirs along).
  uint64_t chunk_steps = 0;
  for (const auto& [key, elements] : kTensors) {
    chunk_steps += cluster::ChunkLayout(elements, sizeof(float), two.chunk_bytes()).num_chunks;
  }
  chunk_steps *= kSteps;
  EXPECT_EQ(steps_completed(s0.get()) + steps_completed(s1.get()) + drained_steps, chunk_steps);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(results[0].switch_step, 4);
  EXPECT_EQ(results[1].switch_step, 8);
  EXPECT_EQ(results[0].to_shards, 3u);
  EXPECT_EQ(results[1].removed, std::vector<std::string>{extra});
  for (const cluster::ReshardResult& r : results) {
    EXPECT_GT(r.chunks_moved, 0u) << r.ToJson();
    EXPECT_LT(r.chunks_moved, r.chunks_total) << r.ToJson();
    EXPECT_GT(r.bytes_moved, 0u) << r.ToJson();
  }
  // Each result counts its own moves: the chunks whose owner's address the new map changes
  // (the second used to count the first one's too).
  const auto moves = [](const proto::ClusterConfig& from, const proto::ClusterConfig& to) {
    const cluster::ShardMap before(from.shards_size(), from.shard_map_epoch());
    const cluster::ShardMap after(to.shards_size(), to.shard_map_epoch());
    uint64_t n = 0;
    for (const auto& [key, elements] : kTensors) {
      const cluster::ChunkLayout layout(elements, sizeof(float), from.chunk_bytes());
      const std::vector<uint32_t> was = before.Assign(key, layout), is = after.Assign(key, layout);
      for (size_t c = 0; c < was.size(); ++c) n += from.shards(was[c]) != to.shards(is[c]);
    }
    return n;
  };
  EXPECT_EQ(results[0].chunks_moved, moves(two, three)) << results[0].ToJson();
  EXPECT_EQ(results[1].chunks_moved, moves(three, back)) << results[1].ToJson();
  EXPECT_GE(switches, 2u * kWorkers);
  for (int w = 0; w < kWorkers; ++w) {
    ASSERT_EQ(moved[w].size(), kTensors.size()) << "worker " << w << " did not finish";
    for (size_t i = 0; i < kTensors.size(); ++i) {
      ASSERT_EQ(moved[w][i].size(), fixed[w][i].size());
      EXPECT_EQ(std::memcmp(moved[w][i].data(), fixed[w][i].data(), fixed[w][i].size() * 4), 0)
          << "worker " << w << " tensor " << kTensors[i].first << " differs from the fixed run";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(OptimizersAndReplicas, Reshard,
                         ::testing::Combine(::testing::Values("momentum", "adam"),
                                            ::testing::Values(1, 2)));

// A coordinator that stops right after its decision (prepared every shard, wrote the
// switch step, sent no Commit): its successor finishes the re-shard from the decision
// (cluster::FinishReshard, as the etcd coordinator does from the re-shard record). One
// shard's prepare ran out meanwhile: it is prepared again for the same step, and training
// ends bit-identical to fixed shards.
TEST(Reshard, ADecidedReshardIsFinishedByASuccessor) {
  std::vector<std::vector<std::vector<float>>> fixed;
  {
    const proto::ClusterConfig c = Config({absl::StrCat("127.0.0.1:", FreePort()),
                                           absl::StrCat("127.0.0.1:", FreePort())}, 1, "adam");
    auto s0 = StartShard(c, 0), s1 = StartShard(c, 1);
    fixed = Train(c, nullptr);
  }
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const std::string b = absl::StrCat("127.0.0.1:", FreePort());
  const std::string extra = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig two = Config({a, b}, 1, "adam");
  const proto::ClusterConfig three = Config({a, b, extra}, 2, "adam");
  auto s0 = StartShard(two, 0), s1 = StartShard(two, 1), s2 = StartShard(three, 2);
  std::atomic<int> reached[kSteps] = {};
  std::atomic<bool> open[kSteps];
  for (int step = 0; step < kSteps; ++step) open[step] = step < 4;
  std::vector<std::vector<std::vector<float>>> moved;
  uint64_t switches = 0;
  std::thread trainer([&] { moved = Train(two, &switches, reached, open); });
  const absl::Time give_up = absl::Now() + absl::Minutes(1);
  while (reached[3].load() < kWorkers && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  absl::SleepFor(absl::Milliseconds(300));  // step 3 completes; step 4 is held

  // The decision: every shard prepared, the switch past every step started; b's prepare
  // runs out before anyone commits.
  int64_t switch_step = 0;
  for (const auto& [address, timeout_ms] :
       std::vector<std::pair<std::string, uint32_t>>{{a, 30000}, {b, 200}, {extra, 30000}}) {
    auto stub = proto::Resharding::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    proto::PrepareReshardRequest prepare;
    *prepare.mutable_next() = three;
    prepare.set_prepare_timeout_ms(timeout_ms);
    prepare.set_old_shards(2);
    grpc::ClientContext ctx;
    proto::PrepareReshardResponse resp;
    ASSERT_TRUE(stub->Prepare(&ctx, prepare, &resp).ok()) << address;
    if (resp.in_old_map()) switch_step = std::max(switch_step, resp.highest_step() + 1);
  }
  EXPECT_EQ(switch_step, 5);  // step 4 counts as started once step 3 has completed
  absl::SleepFor(absl::Milliseconds(400));

  cluster::ReshardOptions o;
  o.deadline = absl::Seconds(10);
  absl::StatusOr<cluster::ReshardResult> finished;
  std::thread successor([&] { finished = cluster::FinishReshard(two, three, switch_step, o); });
  for (server::ShardServer* shard : {s0.get(), s1.get()}) {
    while (absl::Now() < give_up) {
      proto::ReshardStatusResponse status;
      shard->service()->ReshardStatus(&status);
      if (status.state() == "committed" || status.shard_map_epoch() >= 2) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  for (int step = 4; step < kSteps; ++step) open[step] = true;
  successor.join();
  trainer.join();
  ASSERT_TRUE(finished.ok()) << finished.status();
  EXPECT_EQ(finished->switch_step, switch_step);
  EXPECT_EQ(finished->to_shards, 3u);
  EXPECT_GT(finished->chunks_moved, 0u);
  EXPECT_GE(switches, static_cast<uint64_t>(kWorkers));
  EXPECT_EQ(moved, fixed);
}

// A tensor pushed only at step 0 (as DDP's buckets before its first-iteration rebuild) must
// not hold the switch until its patience (rpc_timeout_ms, 2 min here) runs out, with every
// worker waiting: the switch comes at once, and the stale tensor, moved as it is, takes its
// next step on its new owner.
TEST(Reshard, ATensorNotPushedEveryStepDoesNotHoldTheSwitch) {
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const std::string b = absl::StrCat("127.0.0.1:", FreePort());
  const std::string extra = absl::StrCat("127.0.0.1:", FreePort());
  proto::ClusterConfig two = Config({a, b}, 1, "none");
  proto::ClusterConfig three = Config({a, b, extra}, 2, "none");
  two.set_rpc_timeout_ms(120000);
  three.set_rpc_timeout_ms(120000);
  auto s0 = StartShard(two, 0), s1 = StartShard(two, 1);
  std::unique_ptr<server::ShardServer> s2;
  constexpr size_t kN = 3000;  // 6 chunks of 2 KiB: some move to the added shard
  constexpr int kStartAt = 3;  // the switch comes after it: the stale tensor is 2+ behind
  absl::Mutex mu;
  int started = 0;
  const absl::Time begin = absl::Now();
  std::thread coordinator([&] {
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(+[](int* n) { return *n == kWorkers; }, &started));
    }
    s2 = StartShard(three, 2);
    absl::StatusOr<cluster::ReshardResult> r = cluster::RunReshard(three, {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GT(r->switch_step, kStartAt);
    EXPECT_GT(r->chunks_moved, 0u) << r->ToJson();
  });
  OnWorkers(two, [&](int w, worker::Client& client) {
    ASSERT_TRUE(client.Declare("stale", codec::DType::kF32, kN).ok());
    ASSERT_TRUE(client.Declare("w", codec::DType::kF32, kN).ok());
    std::vector<float> g(kN, 1.0f), out(kN);
    ASSERT_TRUE(client.PushPull("stale", 0, g.data(), out.data()).ok());
    // Slow enough that the re-shard switches while the workers train.
    for (int step = 0; step < 400; ++step) {
      if (step == kStartAt) {
        absl::MutexLock lock(&mu);
        ++started;
      }
      absl::SleepFor(absl::Milliseconds(5));
      absl::Status s = client.PushPull("w", step, g.data(), out.data());
      ASSERT_TRUE(s.ok()) << "worker " << w << " step " << step << ": " << s;
    }
    EXPECT_GE(client.stats().map_switches, 1u);
    // The stale tensor's next step, on the new map: the mean of every worker's 2s.
    std::vector<float> two_s(kN, 2.0f);
    absl::Status s = client.PushPull("stale", 1, two_s.data(), out.data());
    ASSERT_TRUE(s.ok()) << "worker " << w << ": " << s;
    EXPECT_EQ(out[0], 2.0f);
    EXPECT_EQ(out[kN - 1], 2.0f);
  });
  coordinator.join();
  // 400 steps of 5 ms and a re-shard: seconds. Held by the stale tensor: over 2 minutes.
  EXPECT_LT(absl::Now() - begin, absl::Seconds(60));
  // A worker started now with the job's original two-shard file is told of the newer map
  // while it registers, and takes it (it failed with ABORTED before).
  absl::StatusOr<std::unique_ptr<worker::Client>> late = worker::Client::Connect(two, {});
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ((*late)->stats().map_switches, 1u);
  EXPECT_TRUE((*late)->Declare("w", codec::DType::kF32, kN).ok());
}

TEST(ReshardErrors, BadConfigsAreRejectedAndTheJobGoesOn) {
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const std::string b = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig two = Config({a, b}, 5, "sgd");
  auto s0 = StartShard(two, 0), s1 = StartShard(two, 1);
  cluster::ReshardOptions o;
  o.deadline = absl::Seconds(1);

  proto::ClusterConfig lower = Config({a}, 4, "sgd");
  absl::StatusOr<cluster::ReshardResult> r = cluster::RunReshard(lower, o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("shard_map_epoch"));

  proto::ClusterConfig same = Config({a}, 5, "sgd");
  r = cluster::RunReshard(same, o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("older shard-map epoch"));

  proto::ClusterConfig workers = Config({a}, 6, "sgd");
  workers.set_workers(kWorkers + 1);
  r = cluster::RunReshard(workers, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("workers"));

  proto::ClusterConfig dup = Config({a, b}, 6, "sgd");
  dup.add_shards(a);
  r = cluster::RunReshard(dup, o);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("listed twice"));

  const std::string never = absl::StrCat("127.0.0.1:", FreePort());
  r = cluster::RunReshard(Config({a, b, never}, 6, "sgd"), o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(never));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("nothing changed"));

  // Still on epoch 5 with both shards: a step goes through.
  PushOnes(two, 1000, 1);
}

// The Prepare of a re-shard of the one-shard job at `a` to two shards (epoch 2).
proto::PrepareReshardRequest PrepareOneToTwo(const std::string& a, int64_t at_step,
                                             uint32_t timeout_ms) {
  proto::PrepareReshardRequest prepare;
  *prepare.mutable_next() = Config({a, absl::StrCat("127.0.0.1:", FreePort())}, 2, "none");
  prepare.set_at_step(at_step);
  prepare.set_prepare_timeout_ms(timeout_ms);
  prepare.set_old_shards(1);
  return prepare;
}

// A Prepare without a Commit (a coordinator that died) is dropped after its timeout: the
// frozen step then goes through on the old map.
TEST(ReshardErrors, PrepareWithoutCommitExpires) {
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig one = Config({a}, 1, "none");
  auto s0 = StartShard(one, 0);
  auto stub = proto::Resharding::NewStub(grpc::CreateChannel(a, grpc::InsecureChannelCredentials()));
  const proto::PrepareReshardRequest prepare = PrepareOneToTwo(a, 1, 500);
  grpc::ClientContext ctx;
  proto::PrepareReshardResponse resp;
  ASSERT_TRUE(stub->Prepare(&ctx, prepare, &resp).ok());
  EXPECT_EQ(resp.highest_step(), 0);
  const absl::Time start = absl::Now();
  PushOnes(one, 10, 2);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(400)) << "step 1 did not wait for the freeze";
  grpc::ClientContext ctx2;
  proto::ReshardStatusResponse st;
  ASSERT_TRUE(stub->ReshardStatus(&ctx2, proto::ReshardStatusRequest(), &st).ok());
  EXPECT_EQ(st.state(), "serving");
  EXPECT_EQ(st.shard_map_epoch(), 1u);
}

// Prepare's highest step counts a chunk's next step once the one before has completed: a
// push of it may have passed the freeze check and not yet reached the chunk. After steps
// 0-2, step 3 counts as started, the switch can be no earlier than 4, and step 3 goes
// through on the old map.
TEST(ReshardErrors, PrepareCountsAChunksNextStepAsStarted) {
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig one = Config({a}, 1, "none");
  auto s0 = StartShard(one, 0);
  PushOnes(one, 10, 3);
  auto stub = proto::Resharding::NewStub(grpc::CreateChannel(a, grpc::InsecureChannelCredentials()));
  const proto::PrepareReshardRequest prepare = PrepareOneToTwo(a, 0, 60000);
  grpc::ClientContext ctx;
  proto::PrepareReshardResponse resp;
  ASSERT_TRUE(stub->Prepare(&ctx, prepare, &resp).ok());
  EXPECT_EQ(resp.highest_step(), 3);
  PushOnes(one, 10, 4, 3);  // not frozen: step 3 goes through on the old map
  proto::CommitReshardRequest commit;
  commit.set_next_epoch(2);
  commit.set_switch_step(3);
  grpc::ClientContext ctx2;
  proto::CommitReshardResponse committed;
  const grpc::Status refused = stub->Commit(&ctx2, commit, &committed);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_THAT(refused.error_message(), HasSubstr("not past step 3"));
  proto::AbortReshardRequest abort;
  abort.set_next_epoch(2);
  grpc::ClientContext ctx3;
  proto::AbortReshardResponse aborted;
  ASSERT_TRUE(stub->Abort(&ctx3, abort, &aborted).ok());
}

// A re-shard to a new shard that does not answer: the old shard sends it the moved chunks
// for up to a minute. A shutdown meanwhile (SIGTERM) cancels that, rather than waiting the
// minute out (and a re-shard prepared meanwhile is refused, naming the moves).
TEST(ReshardErrors, AShardSendingToAPeerThatDoesNotAnswerStopsAtOnce) {
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig one = Config({a}, 1, "none");
  auto s0 = StartShard(one, 0);
  PushOnes(one, 10, 1);
  auto stub =
      proto::Resharding::NewStub(grpc::CreateChannel(a, grpc::InsecureChannelCredentials()));
  const proto::PrepareReshardRequest prepare = PrepareOneToTwo(a, 0, 60000);
  grpc::ClientContext ctx;
  proto::PrepareReshardResponse resp;
  ASSERT_TRUE(stub->Prepare(&ctx, prepare, &resp).ok());
  ASSERT_EQ(resp.highest_step(), 1);
  proto::CommitReshardRequest commit;
  commit.set_next_epoch(2);
  commit.set_switch_step(2);
  grpc::ClientContext ctx2;
  proto::CommitReshardResponse committed;
  const grpc::Status done = stub->Commit(&ctx2, commit, &committed);
  ASSERT_TRUE(done.ok()) << done.error_message();
  PushOnes(one, 10, 2, 1);  // step 1 on the old map: the switch comes after it
  for (absl::Time give_up = absl::Now() + absl::Seconds(20); absl::Now() < give_up;) {
    proto::ReshardStatusResponse status;
    s0->service()->ReshardStatus(&status);
    if (status.shard_map_epoch() == 2) break;
    absl::SleepFor(absl::Milliseconds(5));
  }
  proto::PrepareReshardRequest again = prepare;
  again.mutable_next()->set_shard_map_epoch(3);
  absl::StatusOr<proto::PrepareReshardResponse> refused = s0->service()->PrepareReshard(again);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("still sending the chunks"));
  const absl::Time start = absl::Now();
  s0.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20)) << "the shard waited out its transfer";
}

// Calls of a prepared epoch wait for the switch; past half the request threads they are
// refused as busy, so a peer that sends hundreds of them (the Prepare freezing no step that
// runs) cannot take every thread: the shard goes on answering its admin calls and the
// current map's pushes. Before the bound, 300 waiting transfers left Stats, Abort and the
// workers "Server Threadpool Exhausted" until the prepare expired.
TEST(ReshardErrors, CallsWaitingForAPreparedEpochLeaveThreadsFree) {
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig one = Config({a}, 1, "none");
  auto s0 = StartShard(one, 0);
  auto stub =
      proto::Resharding::NewStub(grpc::CreateChannel(a, grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext ctx;
    proto::PrepareReshardResponse resp;
    ASSERT_TRUE(stub->Prepare(&ctx, PrepareOneToTwo(a, 1000000, 60000), &resp).ok());
  }
  constexpr int kCalls = 300;
  std::atomic<int> busy{0}, ended{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&] {
      // A connection per call, as from many peers (the per-connection bound does not apply).
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto peer = proto::Resharding::NewStub(
          grpc::CreateCustomChannel(a, grpc::InsecureChannelCredentials(), args));
      proto::TransferRequest t;
      t.set_job("reshard");
      t.set_next_epoch(2);
      grpc::ClientContext ctx;
      ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
      proto::TransferResponse r;
      const grpc::Status st = peer->Transfer(&ctx, t, &r);
      // Refused as busy, which peers' and workers' calls retry after a backoff.
      if (cluster::IsBusyRefusal(st) &&
          absl::StrContains(st.error_message(), "wait for shard-map epoch 2")) {
        ++busy;
      }
      ++ended;
    });
  }
  // The calls past the bound (transfers: half of half the request threads) are refused at
  // once; the others wait.
  const int bound = server::TransportLimitsFor(one).max_threads / 4;
  for (int i = 0; i < 300 && busy.load() < kCalls - bound; ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(busy.load(), kCalls - bound);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    proto::ReshardStatusResponse st;
    const grpc::Status answered = stub->ReshardStatus(&ctx, proto::ReshardStatusRequest(), &st);
    EXPECT_TRUE(answered.ok()) << answered.error_message();
    EXPECT_EQ(st.state(), "prepared");
  }
  PushOnes(one, 10, 1);  // the current map's steps go on
  proto::AbortReshardRequest abort;
  abort.set_next_epoch(2);
  grpc::ClientContext ctx;
  proto::AbortReshardResponse aborted;
  ASSERT_TRUE(stub->Abort(&ctx, abort, &aborted).ok());
  for (auto& c : callers) c.join();
  EXPECT_EQ(ended.load(), kCalls);
}

// What a peer can make a shard do through Resharding: a Prepare naming 100,000 shards is
// refused at once, and moved-state parts for chunks the shard does not own are refused
// rather than buffered.
TEST(ReshardErrors, HostileReshardRequestsAreRefusedCheaply) {
  const std::string a = absl::StrCat("127.0.0.1:", FreePort());
  const std::string b = absl::StrCat("127.0.0.1:", FreePort());
  const proto::ClusterConfig joining = Config({a, b}, 2, "none");
  auto s1 = StartShard(joining, 1);  // a shard a re-shard adds, started with the new map
  auto stub = proto::Resharding::NewStub(grpc::CreateChannel(b, grpc::InsecureChannelCredentials()));

  proto::PrepareReshardRequest huge;
  *huge.mutable_next() = joining;
  for (int i = 0; i < 100000; ++i) huge.mutable_next()->add_shards(absl::StrCat("h", i, ":1"));
  huge.mutable_next()->set_shard_map_epoch(3);
  grpc::ClientContext c0;
  c0.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::PrepareReshardResponse r0;
  grpc::Status st = stub->Prepare(&c0, huge, &r0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  for (int64_t at_step : {int64_t{-1}, INT64_MIN, int64_t{1} << 62}) {
    proto::PrepareReshardRequest bad;
    *bad.mutable_next() = joining;
    bad.mutable_next()->set_shard_map_epoch(3);
    bad.set_at_step(at_step);
    grpc::ClientContext c;
    st = stub->Prepare(&c, bad, &r0);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << at_step;
    EXPECT_THAT(st.error_message(), HasSubstr("at_step")) << at_step;
  }

  proto::PrepareReshardRequest prepare;
  *prepare.mutable_next() = joining;
  prepare.set_old_shards(1);
  grpc::ClientContext c1;
  ASSERT_TRUE(stub->Prepare(&c1, prepare, &r0).ok());
  proto::CommitReshardRequest commit;
  commit.set_next_epoch(2);
  commit.set_switch_step(0);
  proto::CommitReshardResponse r1;
  grpc::ClientContext c2;
  ASSERT_TRUE(stub->Commit(&c2, commit, &r1).ok());
  for (int i = 0; i < 3; ++i) {
    proto::TransferRequest t;
    t.set_job("reshard");
    t.set_next_epoch(2);
    t.set_from_shard(0);
    t.mutable_part()->set_key(absl::StrCat("never-declared-", i));
    t.mutable_part()->set_chunk(1u << 30);
    grpc::ClientContext c3;
    proto::TransferResponse r3;
    st = stub->Transfer(&c3, t, &r3);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("undeclared"));
  }
  grpc::ClientContext c4;
  proto::ReshardStatusResponse status;
  ASSERT_TRUE(stub->ReshardStatus(&c4, proto::ReshardStatusRequest(), &status).ok());
  EXPECT_EQ(status.state(), "filling");
  EXPECT_EQ(status.chunks_received(), 0u);
}

}  // namespace
}  // namespace gcomp
