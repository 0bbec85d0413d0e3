// The service over real gRPC on loopback: in-process shards (ShardServer) and Clients.
// With GCOMP_TEST_TLS=1 (//tests:service_tls_test) every connection is mutual TLS with the
// job token (tests/test_certs.h).
#include <cmath>
#include <cstring>
#include <future>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/aggregation.grpc.pb.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "server/grpc_service.h"
#include "cluster/wire_block.h"
#include "cluster/grpc_status.h"
#include "cluster/wire_message.h"
#include "server/shard_service.h"
#include "tests/synthetic_gradient.h"
#include "tests/test_certs.h"
#include "worker/client.h"

namespace gcomp {
namespace {

using ::testing::HasSubstr;

struct Cluster {
  std::vector<std::unique_ptr<server::ShardServer>> shards;
  proto::ClusterConfig config;  // with the real ports
};

std::unique_ptr<Cluster> StartCluster(int shards, int workers, const std::string& mode,
                                      uint64_t chunk_bytes = 16384, uint32_t step_timeout_ms = 5000,
                                      const std::vector<std::string>& more_fields = {}) {
  std::string placeholders;
  for (int k = 0; k < shards; ++k) placeholders += absl::StrCat(k ? "," : "", "127.0.0.1:", k + 1);
  std::vector<std::string> fields = {absl::StrCat("workers=", workers),
                                     "shards=" + placeholders,
                                     "uplink.mode=" + mode,
                                     "downlink.mode=" + mode,
                                     absl::StrCat("chunk_bytes=", chunk_bytes),
                                     absl::StrCat("step_timeout_ms=", step_timeout_ms),
                                     absl::StrCat("rpc_timeout_ms=", step_timeout_ms * 2)};
  fields.insert(fields.end(), more_fields.begin(), more_fields.end());
  absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig("job: test\n", fields);
  EXPECT_TRUE(config.ok()) << config.status();
  if (testing::TlsFromEnvironment()) testing::UseTestTls(&*config, "server");
  auto c = std::make_unique<Cluster>();
  c->config = *config;
  c->config.clear_shards();
  for (int k = 0; k < shards; ++k) {
    auto s = server::ShardServer::Start(*config, {static_cast<uint32_t>(k), 2, {}}, "127.0.0.1:0");
    EXPECT_TRUE(s.ok()) << s.status();
    c->config.add_shards(absl::StrCat("127.0.0.1:", (*s)->port()));
    c->shards.push_back(*std::move(s));
  }
  // Workers present the client certificate.
  if (testing::TlsFromEnvironment()) testing::UseTestTls(&c->config, "client");
  return c;
}

// A channel to `target` as the workers of `config` dial it (TLS and token when on).
std::shared_ptr<grpc::Channel> NewChannel(const proto::ClusterConfig& config,
                                          const std::string& target,
                                          const grpc::ChannelArguments& args = {}) {
  absl::StatusOr<cluster::ClientSecurity> security = cluster::MakeClientSecurity(config);
  EXPECT_TRUE(security.ok()) << security.status();
  return security->NewChannel(target, args);
}

TEST(Transport, IsWhatTheEnvironmentAsksFor) {
  auto cluster = StartCluster(1, 1, "none");
  auto plain = proto::Aggregation::NewStub(
      grpc::CreateChannel(cluster->config.shards(0), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::StatsResponse stats;
  grpc::Status s = plain->Stats(&ctx, proto::StatsRequest(), &stats);
  if (testing::TlsFromEnvironment()) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << "a plaintext call got through";
  } else {
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
}

using testing::SyntheticGradient;

// Worker `w`'s options, the rest default.
worker::ClientOptions Worker(uint32_t w) {
  worker::ClientOptions options;
  options.worker = w;
  return options;
}

// Pushes W gradients (worker w's = SyntheticGradient(n, w)) for one step and checks every result
// against the f32 mean in worker order: bit-exact for lossless/none, within the
// codec's bound for near-lossless.
void CheckAggregation(int shards, int workers, size_t n, const std::string& mode) {
  SCOPED_TRACE(absl::StrCat("S=", shards, " W=", workers, " n=", n, " ", mode));
  auto cluster = StartCluster(shards, workers, mode);
  std::vector<std::unique_ptr<worker::Client>> clients;
  for (int w = 0; w < workers; ++w) {
    auto c = worker::Client::Connect(cluster->config, Worker(static_cast<uint32_t>(w)));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Declare("t", codec::DType::kF32, n).ok());
    clients.push_back(*std::move(c));
  }
  std::vector<std::vector<float>> in(workers), out(workers, std::vector<float>(n));
  for (int w = 0; w < workers; ++w) in[w] = SyntheticGradient(n, w + 1);
  for (int step = 0; step < 2; ++step) {
    std::vector<std::future<absl::Status>> done;
    for (int w = 0; w < workers; ++w) {
      done.push_back(clients[w]->PushPullAsync("t", step, in[w].data(), out[w].data()));
    }
    for (auto& d : done) ASSERT_TRUE(d.get().ok());
  }
  std::vector<float> ref = in[0];
  for (int w = 1; w < workers; ++w) {
    for (size_t i = 0; i < n; ++i) ref[i] += in[w][i];
  }
  for (size_t i = 0; i < n; ++i) ref[i] /= static_cast<float>(workers);
  for (int w = 1; w < workers; ++w) {
    ASSERT_EQ(0, std::memcmp(out[0].data(), out[w].data(), n * 4)) << "workers disagree";
  }
  if (mode != "near-lossless") {
    ASSERT_EQ(0, std::memcmp(out[0].data(), ref.data(), n * 4)) << "not bit-exact";
    return;
  }
  codec::Policy p;  // the config's default near-lossless policy
  const size_t chunk = 16384 / 4;
  for (size_t c0 = 0; c0 < n; c0 += chunk) {
    const size_t c1 = std::min(n, c0 + chunk);
    std::vector<double> up(c1 - c0, 0.0);
    for (int w = 0; w < workers; ++w) {
      double m = 0;
      for (size_t i = c0; i < c1; ++i) m = std::max(m, std::fabs(double(in[w][i])));
      for (size_t i = c0; i < c1; ++i) up[i - c0] += codec::ErrorBound(p, in[w][i], m) / workers;
    }
    double m = 0, me = 0;
    for (size_t i = c0; i < c1; ++i) {
      m = std::max(m, std::fabs(double(ref[i])));
      me = std::max(me, up[i - c0]);
    }
    for (size_t i = c0; i < c1; ++i) {
      const double e = up[i - c0] + std::ldexp(std::fabs(ref[i]) * (workers + 2), -23) + 1e-37;
      const double bound = e + codec::ErrorBound(p, std::fabs(ref[i]) + e, m + me + e);
      ASSERT_LE(std::fabs(double(out[0][i]) - ref[i]), bound) << "element " << i;
    }
  }
}

TEST(Aggregation, MatchesReferenceAcrossWorkersShardsAndSizes) {
  for (int shards = 1; shards <= 3; ++shards) {
    for (int workers = 1; workers <= 4; ++workers) {
      for (size_t n : {size_t{1}, size_t{4097 * 3}}) {
        for (const char* mode : {"lossless", "near-lossless"}) {
          CheckAggregation(shards, workers, n, mode);
        }
      }
    }
  }
}

// A shard refusing calls because one connection has too many in flight is busy, not
// broken: the Client backs off and retries, and the step completes.
TEST(Aggregation, BusyRefusalsAreRetried) {
  auto cluster = StartCluster(1, 1, "lossless", 16384, 5000,
                              {"limits.max_calls_per_client=1", "channels_per_shard=1",
                               "max_inflight_chunks=8", "retry_backoff_ms=5", "max_retries=50"});
  auto c = worker::Client::Connect(cluster->config, Worker(0));
  ASSERT_TRUE(c.ok()) << c.status();
  const size_t n = 4096 * 16;  // 16 chunks, 8 sent at once over one connection
  ASSERT_TRUE((*c)->Declare("t", codec::DType::kF32, n).ok());
  std::vector<float> in = SyntheticGradient(n, 1), out(n);
  for (int step = 0; step < 3; ++step) {
    absl::Status s = (*c)->PushPull("t", step, in.data(), out.data());
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_EQ(0, std::memcmp(in.data(), out.data(), n * 4));
  }
  EXPECT_GT((*c)->stats().retries, 0u) << "no call was refused: the test proves nothing";
}

TEST(Aggregation, NoneModeIsBitExact) { CheckAggregation(2, 3, 50000, "none"); }

// Two processes started as worker 0 (told apart here by their sessions, which a process
// picks at random): once the second has connected, the first one's pushes fail at once
// with ALREADY_EXISTS instead of counting as retries of the second's, and the job goes on
// with the second.
TEST(Aggregation, TwoProcessesWithOneWorkerIndexAreRefused) {
  auto cluster = StartCluster(2, 2, "near-lossless", 16384, 5000);
  worker::ClientOptions first = Worker(0), second = Worker(0);
  first.session = 0x1111;
  first.name = "trainer-a";
  second.session = 0x2222;
  second.name = "trainer-b";
  const size_t n = 4096 * 5;  // chunks on both shards
  std::vector<std::unique_ptr<worker::Client>> clients;
  for (const worker::ClientOptions& o : {first, Worker(1), second}) {
    auto c = worker::Client::Connect(cluster->config, o);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Declare("t", codec::DType::kF32, n).ok());
    clients.push_back(*std::move(c));
  }
  std::vector<float> in = SyntheticGradient(n, 1), out(n);
  const absl::Time start = absl::Now();
  absl::Status refused = clients[0]->PushPull("t", 0, in.data(), out.data());
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("another process registered as worker 0 ('trainer-b')"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(4));  // not the 5 s step timeout
  std::vector<float> out1(n);
  std::future<absl::Status> other = clients[1]->PushPullAsync("t", 0, in.data(), out1.data());
  EXPECT_TRUE(clients[2]->PushPull("t", 0, in.data(), out.data()).ok());
  EXPECT_TRUE(other.get().ok());
}

proto::CompressedBlock RawBlock(const std::vector<float>& v, const std::string& key, int64_t step,
                                uint32_t worker) {
  proto::CompressedBlock b;
  EXPECT_TRUE(cluster::EncodeWireBlock({true, {}}, codec::DType::kF32, v.data(), v.size(), &b).ok());
  proto::BlockAddress* a = b.mutable_address();
  a->set_job("test");
  a->set_key(key);
  a->set_step(step);
  a->set_worker(worker);
  a->set_shard_map_epoch(1);
  return b;
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cluster_ = StartCluster(1, 2, "none", 16384, 500);
    grpc::ChannelArguments args;
    args.SetMaxSendMessageSize(64 << 20);
    stub_ = proto::Aggregation::NewStub(
        NewChannel(cluster_->config, cluster_->config.shards(0), args));
    proto::DeclareTensorRequest d;
    d.set_job("test");
    d.set_key("t");
    d.set_dtype(proto::DTYPE_F32);
    d.set_elements(8);
    d.set_shard_map_epoch(1);
    proto::DeclareTensorResponse r;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->DeclareTensor(&ctx, d, &r).ok());
  }

  grpc::Status Push(const proto::CompressedBlock& b, proto::CompressedBlock* out = nullptr) {
    proto::CompressedBlock resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    return stub_->PushPull(&ctx, b, out ? out : &resp);
  }

  // Completes step `step` with both workers; returns the result.
  std::vector<float> Step(int64_t step, float a, float b) {
    std::vector<float> va(8, a), vb(8, b);
    proto::CompressedBlock out;
    std::thread t([&] { EXPECT_TRUE(Push(RawBlock(va, "t", step, 0)).ok()); });
    EXPECT_TRUE(Push(RawBlock(vb, "t", step, 1), &out).ok());
    t.join();
    std::vector<float> v(8);
    EXPECT_TRUE(cluster::DecodeWireBlock(out, codec::DType::kF32, 8, v.data()).ok());
    return v;
  }

  proto::StatsResponse Stats() {
    proto::StatsResponse s;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->Stats(&ctx, proto::StatsRequest(), &s).ok());
    return s;
  }

  std::unique_ptr<Cluster> cluster_;
  std::unique_ptr<proto::Aggregation::Stub> stub_;
  const std::vector<float> ones_ = std::vector<float>(8, 1.0f);
};

TEST_F(BadInputTest, RetriedPushesAreCountedOnce) {
  std::vector<float> a(8, 4.0f), b(8, 2.0f);
  proto::CompressedBlock out;
  std::thread first([&] { EXPECT_TRUE(Push(RawBlock(a, "t", 0, 0)).ok()); });
  std::thread retry([&] {
    absl::SleepFor(absl::Milliseconds(50));
    EXPECT_TRUE(Push(RawBlock(a, "t", 0, 0)).ok());  // the same push again while open
  });
  absl::SleepFor(absl::Milliseconds(150));
  ASSERT_TRUE(Push(RawBlock(b, "t", 0, 1), &out).ok());
  first.join();
  retry.join();
  proto::CompressedBlock again;
  ASSERT_TRUE(Push(RawBlock(b, "t", 0, 1), &again).ok());  // retry after completion
  std::vector<float> v(8), w(8);
  ASSERT_TRUE(cluster::DecodeWireBlock(out, codec::DType::kF32, 8, v.data()).ok());
  ASSERT_TRUE(cluster::DecodeWireBlock(again, codec::DType::kF32, 8, w.data()).ok());
  EXPECT_EQ(v, std::vector<float>(8, 3.0f));
  EXPECT_EQ(w, v);
  EXPECT_EQ(Stats().duplicate_pushes(), 2u);
  EXPECT_EQ(Stats().steps_completed(), 1u);
}

TEST_F(BadInputTest, CorruptBlockIsDataLoss) {
  auto b = RawBlock(ones_, "t", 0, 0);
  (*b.mutable_data())[3] ^= 0x10;
  EXPECT_EQ(Push(b).error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_EQ(Step(0, 1, 3), std::vector<float>(8, 2.0f));  // state unchanged
}

TEST_F(BadInputTest, WrongSizeIsInvalidArgument) {
  EXPECT_EQ(Push(RawBlock(std::vector<float>(7, 1.0f), "t", 0, 0)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Step(0, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, WrongDtypeIsInvalidArgument) {
  auto b = RawBlock(ones_, "t", 0, 0);
  b.set_dtype(proto::DTYPE_F16);
  EXPECT_EQ(Push(b).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(Step(0, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, UnknownKeyIsNotFound) {
  EXPECT_EQ(Push(RawBlock(ones_, "nope", 0, 0)).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Step(0, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, UnknownJobIsNotFound) {
  auto b = RawBlock(ones_, "t", 0, 0);
  b.mutable_address()->set_job("other");
  EXPECT_EQ(Push(b).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Step(0, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, StaleStepIsFailedPrecondition) {
  Step(0, 1, 1);
  Step(1, 1, 1);
  grpc::Status s = Push(RawBlock(ones_, "t", 0, 0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("stale step 0"));
  EXPECT_EQ(Step(2, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, FutureStepIsFailedPrecondition) {
  Step(0, 1, 1);
  grpc::Status s = Push(RawBlock(ones_, "t", 5, 0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("future step 5"));
  EXPECT_EQ(Step(1, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, WrongEpochIsFailedPrecondition) {
  auto b = RawBlock(ones_, "t", 0, 0);
  b.mutable_address()->set_shard_map_epoch(7);
  grpc::Status s = Push(b);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("epoch"));
  EXPECT_EQ(Step(0, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, OversizedMessageIsResourceExhausted) {
  auto b = RawBlock(ones_, "t", 0, 0);
  b.mutable_data()->append(cluster_->config.max_message_bytes() + 1, 'x');
  EXPECT_EQ(Push(b).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  auto c = RawBlock(ones_, "t", 0, 0);  // fits the message limit, not the codec bound
  c.mutable_data()->append(4096, 'x');
  EXPECT_EQ(Push(c).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(Step(0, 1, 3), std::vector<float>(8, 2.0f));
}

TEST_F(BadInputTest, MissingWorkerIsNamedWithinTheDeadline) {
  proto::RegisterWorkerRequest reg;
  reg.set_job("test");
  reg.set_worker(1);
  reg.set_name("trainer-1");
  reg.set_shard_map_epoch(1);
  proto::RegisterWorkerResponse rr;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->RegisterWorker(&ctx, reg, &rr).ok());
  const absl::Time start = absl::Now();
  grpc::Status s = Push(RawBlock(ones_, "t", 0, 0));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_THAT(s.error_message(), HasSubstr("missing workers: trainer-1"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));  // step timeout 500 ms
}

// Workers 0 and 1 of `config` declare "t" of n elements and run steps 0 and 1 with
// SyntheticGradient inputs 1 and 2 (*in); *out holds each worker's last result.
void TwoWorkersTwoSteps(const proto::ClusterConfig& config, size_t n,
                        std::vector<std::unique_ptr<worker::Client>>* clients,
                        std::vector<std::vector<float>>* in,
                        std::vector<std::vector<float>>* out) {
  for (uint32_t w = 0; w < 2; ++w) {
    auto c = worker::Client::Connect(config, Worker(w));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Declare("t", codec::DType::kF32, n).ok());
    clients->push_back(*std::move(c));
  }
  *in = {SyntheticGradient(n, 1), SyntheticGradient(n, 2)};
  out->assign(2, std::vector<float>(n));
  for (int step = 0; step < 2; ++step) {
    std::vector<std::future<absl::Status>> done;
    for (uint32_t w = 0; w < 2; ++w) {
      done.push_back((*clients)[w]->PushPullAsync("t", step, (*in)[w].data(), (*out)[w].data()));
    }
    for (auto& d : done) ASSERT_TRUE(d.get().ok()) << "step " << step;
  }
}

// Workers and shards of this version check blocks by XXH3 where the other end reads it;
// peers of earlier versions know only XXH64 and no kind field (proto::ChecksumKind).
using VersionSkewTest = BadInputTest;

TEST_F(VersionSkewTest, WorkerOfAnEarlierVersionGetsXxh64Replies) {
  proto::CompressedBlock old = RawBlock(ones_, "t", 0, 0);
  proto::CompressedBlock fast = RawBlock(std::vector<float>(8, 3.0f), "t", 0, 1);
  ASSERT_EQ(fast.checksum_kind(), proto::CHECKSUM_XXH3_64);
  ASSERT_TRUE(cluster::UseXxh64(&old).ok());
  proto::CompressedBlock out_old, out_fast;
  std::thread t([&] { EXPECT_TRUE(Push(old, &out_old).ok()); });
  ASSERT_TRUE(Push(fast, &out_fast).ok());
  t.join();
  EXPECT_EQ(out_old.checksum_kind(), proto::CHECKSUM_XXH64);
  EXPECT_EQ(out_fast.checksum_kind(), proto::CHECKSUM_XXH3_64);
  const absl::string_view reply = out_old.data();
  EXPECT_EQ(out_old.checksum(),
            *cluster::WireChecksum(proto::CHECKSUM_XXH64, cluster::WirePieces(&reply, 1)));
  for (const proto::CompressedBlock* out : {&out_old, &out_fast}) {
    std::vector<float> v(8);
    ASSERT_TRUE(cluster::DecodeWireBlock(*out, codec::DType::kF32, 8, v.data()).ok());
    EXPECT_EQ(v, std::vector<float>(8, 2.0f));
  }
  // A Pull that lists no kind (an earlier worker's) is answered by XXH64 too.
  proto::PullRequest req;
  req.set_job("test");
  req.set_key("t");
  req.set_shard_map_epoch(1);
  proto::CompressedBlock pulled;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Pull(&ctx, req, &pulled).ok());
  EXPECT_EQ(pulled.checksum_kind(), proto::CHECKSUM_XXH64);
  EXPECT_TRUE(cluster::CheckWireBlock(pulled, codec::DType::kF32, 8).ok());
}

// A shard of an earlier version, emulated over a real one: its RegisterWorker lists no
// checksum kind, it verifies every push by XXH64 whatever kind the push names (it does not
// know the field), and it sees no checksums_read in a Pull.
class EarlierVersionShard final : public proto::Aggregation::Service {
 public:
  EarlierVersionShard(server::ShardService* shard, std::shared_ptr<cluster::JobToken> token)
      : shard_(shard), inner_(shard, std::move(token)) {}

  grpc::Status RegisterWorker(grpc::ServerContext* c, const proto::RegisterWorkerRequest* r,
                              proto::RegisterWorkerResponse* out) override {
    grpc::Status s = inner_.RegisterWorker(c, r, out);
    out->clear_checksums_read();
    return s;
  }
  grpc::Status DeclareTensor(grpc::ServerContext* c, const proto::DeclareTensorRequest* r,
                             proto::DeclareTensorResponse* out) override {
    return inner_.DeclareTensor(c, r, out);
  }
  grpc::Status PushPull(grpc::ServerContext* c, const proto::CompressedBlock* r,
                        proto::CompressedBlock* out) override {
    if (r->checksum_kind() != proto::CHECKSUM_XXH64) {
      return grpc::Status(grpc::StatusCode::DATA_LOSS,
                          "block checksum mismatch: data corrupted in transit");
    }
    // The service's PushPull is a callback method; the shard's blocking call answers the same.
    grpc::Status s = cluster::ToGrpc(shard_->PushPull(*r, absl::FromChrono(c->deadline()), out));
    return s;
  }
  grpc::Status Pull(grpc::ServerContext* c, const proto::PullRequest* r,
                    proto::CompressedBlock* out) override {
    proto::PullRequest earlier = *r;
    earlier.clear_checksums_read();
    return inner_.Pull(c, &earlier, out);
  }

 private:
  server::ShardService* shard_;
  server::AggregationGrpcService inner_;
};

TEST(VersionSkew, WorkersCheckByXxh64WithAShardOfAnEarlierVersion) {
  const size_t n = 4097 * 3;
  auto cluster = StartCluster(1, 2, "lossless");  // for its configs
  proto::ClusterConfig shard_config = cluster->config;
  if (testing::TlsFromEnvironment()) testing::UseTestTls(&shard_config, "server");
  absl::StatusOr<cluster::ServerSecurity> security = cluster::MakeServerSecurity(shard_config);
  ASSERT_TRUE(security.ok()) << security.status();
  auto shard = server::ShardService::Create(shard_config, {0, 2, {}});
  ASSERT_TRUE(shard.ok()) << shard.status();
  EarlierVersionShard service(shard->get(), security->token);
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", security->credentials, &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  proto::ClusterConfig config = cluster->config;
  config.set_shards(0, absl::StrCat("127.0.0.1:", port));

  // The emulation refuses what an earlier shard could not verify.
  auto stub = proto::Aggregation::NewStub(NewChannel(config, config.shards(0)));
  proto::CompressedBlock fast = RawBlock(std::vector<float>(8, 1.0f), "t", 0, 0);
  proto::CompressedBlock refused;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub->PushPull(&ctx, fast, &refused).error_code(), grpc::StatusCode::DATA_LOSS);

  std::vector<std::unique_ptr<worker::Client>> clients;
  std::vector<std::vector<float>> in, out;
  ASSERT_NO_FATAL_FAILURE(TwoWorkersTwoSteps(config, n, &clients, &in, &out));
  std::vector<float> mean(n);
  for (size_t i = 0; i < n; ++i) mean[i] = (in[0][i] + in[1][i]) * 0.5f;
  EXPECT_EQ(0, std::memcmp(out[0].data(), mean.data(), n * 4));
  std::vector<float> pulled(n, -1.0f);
  ASSERT_TRUE(clients[1]->Pull("t", pulled.data()).ok());
  EXPECT_EQ(0, std::memcmp(pulled.data(), out[1].data(), n * 4));
  server->Shutdown(absl::ToChronoTime(absl::Now()));
}

// Pull end to end: after a step, every worker's Pull returns exactly what its push-pull
// returned (lossy mode, so this also checks the shard serves the cached encoded result).
TEST(Pull, ReturnsTheLastStepsResult) {
  const size_t n = 4097 * 3;  // several chunks over two shards
  auto cluster = StartCluster(2, 2, "near-lossless");
  std::vector<std::unique_ptr<worker::Client>> clients;
  std::vector<std::vector<float>> in, out;
  ASSERT_NO_FATAL_FAILURE(TwoWorkersTwoSteps(cluster->config, n, &clients, &in, &out));
  for (uint32_t w = 0; w < 2; ++w) {
    std::vector<float> pulled(n, -1.0f);
    ASSERT_TRUE(clients[w]->Pull("t", pulled.data()).ok());
    EXPECT_EQ(0, std::memcmp(pulled.data(), out[w].data(), n * 4)) << "worker " << w;
  }
}

TEST(Pull, UnknownKeyIsNotFound) {
  auto cluster = StartCluster(1, 1, "none");
  auto client = worker::Client::Connect(cluster->config, Worker(0));
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> out(4);
  EXPECT_EQ((*client)->Pull("nope", out.data()).code(), absl::StatusCode::kNotFound);

  // The shard itself, asked directly for a key nobody declared.
  auto stub =
      proto::Aggregation::NewStub(NewChannel(cluster->config, cluster->config.shards(0)));
  proto::PullRequest req;
  req.set_job("test");
  req.set_key("nope");
  req.set_shard_map_epoch(1);
  proto::CompressedBlock resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub->Pull(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), HasSubstr("'nope'"));
}

}  // namespace
}  // namespace gcomp
