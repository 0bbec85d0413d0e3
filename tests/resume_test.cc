// Training through worker::Client over real gRPC on loopback, stopped and resumed from a
// checkpoint into another number of shards: Client::ResumeStep names the step to go on
// from, and the run ends bit-identical to one that never stopped (docs/CHECKPOINT.md).
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "cluster/cluster_config.h"
#include "server/grpc_service.h"
#include "worker/client.h"

namespace gcomp {
namespace {

constexpr int kWorkers = 3;
constexpr size_t kElements = 5000;  // 5 chunks of 1024 f32 (chunk_bytes 4096)

struct Cluster {
  std::vector<std::unique_ptr<server::ShardServer>> shards;
  proto::ClusterConfig config;  // with the real ports
};

std::unique_ptr<Cluster> Start(int shards, const std::string& dir, int every_steps) {
  std::string placeholders;
  for (int k = 0; k < shards; ++k) placeholders += absl::StrCat(k ? "," : "", "127.0.0.1:", k + 1);
  std::vector<std::string> o = {absl::StrCat("workers=", kWorkers), "shards=" + placeholders,
                                "uplink.mode=lossless", "downlink.mode=lossless",
                                "optimizer.name=adam", "chunk_bytes=4096"};
  if (!dir.empty()) {
    o.push_back("checkpoint.dir=" + dir);
    o.push_back(absl::StrCat("checkpoint.every_steps=", every_steps));
  }
  absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig("job: resume\n", o);
  EXPECT_TRUE(config.ok()) << config.status();
  auto c = std::make_unique<Cluster>();
  c->config = *config;
  c->config.clear_shards();
  for (int k = 0; k < shards; ++k) {
    auto s = server::ShardServer::Start(*config, {static_cast<uint32_t>(k), 2, {}}, "127.0.0.1:0");
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return nullptr;
    c->config.add_shards(absl::StrCat("127.0.0.1:", (*s)->port()));
    c->shards.push_back(*std::move(s));
  }
  return c;
}

std::vector<float> Gradient(int worker, int64_t step) {
  std::vector<float> g(kElements);
  for (size_t i = 0; i < kElements; ++i) {
    g[i] = std::sin(0.01f * static_cast<float>(i) + 0.3f * static_cast<float>(step)) * 1e-2f *
           static_cast<float>(worker + 1);
  }
  return g;
}

// Workers that declare "w" (initial value from a fixed formula) and train steps [from, to);
// returns worker 0's last result.
std::vector<float> Train(const Cluster& c, int64_t from, int64_t to, int64_t* resume = nullptr) {
  std::vector<std::unique_ptr<worker::Client>> clients;
  std::vector<float> init(kElements);
  for (size_t i = 0; i < kElements; ++i) init[i] = 0.25f - 1e-4f * static_cast<float>(i);
  for (int w = 0; w < kWorkers; ++w) {
    worker::ClientOptions o;
    o.worker = w;
    auto client = worker::Client::Connect(c.config, o);
    EXPECT_TRUE(client.ok()) << client.status();
    if (!client.ok()) return {};
    absl::Status s = (*client)->Declare("w", codec::DType::kF32, kElements, init.data());
    EXPECT_TRUE(s.ok()) << s;
    clients.push_back(*std::move(client));
  }
  if (resume != nullptr) {
    for (auto& client : clients) {
      absl::StatusOr<int64_t> r = client->ResumeStep("w");
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) *resume = *r;
    }
    from = *resume;
  }
  std::vector<std::vector<float>> out(kWorkers, std::vector<float>(kElements));
  for (int64_t step = from; step < to; ++step) {
    std::vector<std::vector<float>> in;
    std::vector<std::future<absl::Status>> done;
    for (int w = 0; w < kWorkers; ++w) in.push_back(Gradient(w, step));
    for (int w = 0; w < kWorkers; ++w) {
      done.push_back(clients[w]->PushPullAsync("w", step, in[w].data(), out[w].data()));
    }
    for (auto& f : done) {
      absl::Status s = f.get();
      EXPECT_TRUE(s.ok()) << s;
    }
  }
  return out[0];
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

TEST(Resume, FreshTensorResumesAtStepZero) {
  auto c = Start(2, "", 0);
  ASSERT_NE(c, nullptr);
  int64_t resume = -1;
  Train(*c, 0, 0, &resume);
  EXPECT_EQ(resume, 0);
}

TEST(Resume, TwoShardsCheckpointResumeInThreeBitIdentical) {
  std::vector<float> reference;
  {
    auto c = Start(2, "", 0);
    ASSERT_NE(c, nullptr);
    reference = Train(*c, 0, 9);
  }
  std::string tmpl = absl::StrCat(::testing::TempDir(), "/resumeXXXXXX");
  ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
  {
    auto c = Start(2, tmpl, 5);  // a checkpoint of step 4
    ASSERT_NE(c, nullptr);
    Train(*c, 0, 6);  // then two more steps that the restart loses
    for (auto& s : c->shards) s->service()->FlushCheckpoints();
  }
  auto c = Start(3, tmpl, 5);
  ASSERT_NE(c, nullptr);
  int64_t resume = -1;
  std::vector<float> resumed = Train(*c, -1, 9, &resume);
  EXPECT_EQ(resume, 5);
  EXPECT_TRUE(SameBits(resumed, reference));
}

}  // namespace
}  // namespace gcomp
