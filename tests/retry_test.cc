// Client retries on UNAVAILABLE over real gRPC on loopback: a shard that is not listening
// yet, a shard whose replies are lost, a retry budget that runs out, and a connection that
// is never answered. With GCOMP_TEST_TLS=1 (//tests:retry_tls_test) over mutual TLS with
// the job token.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "cluster/grpc_status.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/aggregation.grpc.pb.h"
#include "server/grpc_service.h"
#include "server/shard_service.h"
#include "tests/test_certs.h"
#include "worker/client.h"

namespace gcomp {
namespace {

using ::testing::HasSubstr;

constexpr size_t kElements = 3000;  // 3 chunks of 4 KiB

// Worker `w`'s options, the rest default.
worker::ClientOptions Worker(uint32_t w) {
  worker::ClientOptions options;
  options.worker = w;
  return options;
}

// What the test's shards listen with: the shard side of Config()'s security.
cluster::ServerSecurity ShardSecurity();

// A grpc::Server over a ShardService it borrows, so the shard's state outlives the
// listener: the test stops listening and listens again on the same port.
class Listener {
 public:
  // `service` must outlive the listener.
  Listener(grpc::Service* service, const std::string& address) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, ShardSecurity().credentials, &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
  }
  ~Listener() { Stop(); }
  void Stop() {
    if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
    server_.reset();
  }
  int port() const { return port_; }

 private:
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

// Forwards to the shard, but answers the first `lose` PushPulls that the shard completed
// with UNAVAILABLE, as if the reply had been lost on the way back.
class LossyReplies final : public proto::Aggregation::Service {
 public:
  // `shard` must outlive this service.
  LossyReplies(server::ShardService* shard, int lose)
      : shard_(shard), inner_(shard, ShardSecurity().token), lose_(lose) {}

  grpc::Status RegisterWorker(grpc::ServerContext* c, const proto::RegisterWorkerRequest* r,
                              proto::RegisterWorkerResponse* out) override {
    return inner_.RegisterWorker(c, r, out);
  }
  grpc::Status DeclareTensor(grpc::ServerContext* c, const proto::DeclareTensorRequest* r,
                             proto::DeclareTensorResponse* out) override {
    return inner_.DeclareTensor(c, r, out);
  }
  grpc::Status PushPull(grpc::ServerContext* c, const proto::CompressedBlock* r,
                        proto::CompressedBlock* out) override {
    // The service's PushPull is a callback method; the shard's blocking call answers the same.
    grpc::Status s = cluster::ToGrpc(shard_->PushPull(*r, absl::FromChrono(c->deadline()), out));
    if (s.ok() && lose_.fetch_sub(1) > 0) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "reply lost (test)");
    }
    return s;
  }
  grpc::Status Pull(grpc::ServerContext* c, const proto::PullRequest* r,
                    proto::CompressedBlock* out) override {
    grpc::Status s = inner_.Pull(c, r, out);
    absl::MutexLock lock(&mu_);
    if (s.ok() && tamper_pull_) tamper_pull_(out->mutable_address());
    return s;
  }
  // Changes the address of every later Pull reply (a broken or hostile shard).
  void TamperPulls(std::function<void(proto::BlockAddress*)> tamper) {
    absl::MutexLock lock(&mu_);
    tamper_pull_ = std::move(tamper);
  }
  grpc::Status Stats(grpc::ServerContext* c, const proto::StatsRequest* r,
                     proto::StatsResponse* out) override {
    return inner_.Stats(c, r, out);
  }

 private:
  server::ShardService* shard_;
  server::AggregationGrpcService inner_;
  std::atomic<int> lose_;
  absl::Mutex mu_;
  std::function<void(proto::BlockAddress*)> tamper_pull_ ABSL_GUARDED_BY(mu_);
};

// A TCP forwarder on loopback to `backend_port` that swallows its first connection:
// accepted, then never read or answered, like a connection whose packets are lost. Later
// connections are forwarded both ways.
class BlackHoleFirstConnection {
 public:
  explicit BlackHoleFirstConnection(int backend_port) : backend_port_(backend_port) {
    listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(a);
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), len) != 0 || listen(listen_fd_, 16) != 0 ||
        getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      ADD_FAILURE() << "proxy: cannot listen: " << std::strerror(errno);
      return;
    }
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~BlackHoleFirstConnection() {
    shutdown(listen_fd_, SHUT_RDWR);  // ends the blocked accept()
    if (acceptor_.joinable()) acceptor_.join();
    close(listen_fd_);
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);  // ends the pumps' blocked reads
    for (std::thread& t : pumps_) t.join();
    for (int fd : fds_) close(fd);
  }
  int port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  void AcceptLoop() {
    while (true) {
      const int client = accept(listen_fd_, nullptr, nullptr);
      if (client < 0) return;
      absl::MutexLock lock(&mu_);
      fds_.push_back(client);
      if (accepted_++ == 0) continue;  // the swallowed one
      const int backend = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<uint16_t>(backend_port_));
      fds_.push_back(backend);
      if (connect(backend, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
        shutdown(client, SHUT_RDWR);
        continue;
      }
      pumps_.emplace_back([client, backend] { Pump(client, backend); });
      pumps_.emplace_back([client, backend] { Pump(backend, client); });
    }
  }
  static void Pump(int from, int to) {
    char buffer[65536];
    ssize_t n;
    while ((n = read(from, buffer, sizeof(buffer))) > 0 && WriteAll(to, buffer, n)) {
    }
    shutdown(from, SHUT_RDWR);
    shutdown(to, SHUT_RDWR);
  }
  static bool WriteAll(int fd, const char* p, ssize_t n) {
    for (ssize_t w; n > 0; p += w, n -= w) {
      // send, not write: a peer that has closed must end the pump, not raise SIGPIPE and
      // kill the test (exit 141, seen under TSan when the client dropped a connection).
      if ((w = send(fd, p, static_cast<size_t>(n), MSG_NOSIGNAL)) <= 0) return false;
    }
    return true;
  }

  const int backend_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> accepted_{0};
  std::thread acceptor_;
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> pumps_ ABSL_GUARDED_BY(mu_);
};

proto::ClusterConfig Config(int port, uint32_t workers, uint32_t max_retries) {
  absl::StatusOr<proto::ClusterConfig> c = cluster::ParseClusterConfig(
      "job: retry\n",
      {absl::StrCat("shards=127.0.0.1:", port), absl::StrCat("workers=", workers),
       "uplink.mode=lossless", "downlink.mode=lossless", "chunk_bytes=4096",
       absl::StrCat("max_retries=", max_retries), "retry_backoff_ms=20",
       "step_timeout_ms=10000", "rpc_timeout_ms=20000", "channels_per_shard=1"});
  EXPECT_TRUE(c.ok()) << c.status();
  if (testing::TlsFromEnvironment()) testing::UseTestTls(&*c, "client");
  return *c;
}

cluster::ServerSecurity ShardSecurity() {
  proto::ClusterConfig c = Config(1, 1, 0);
  if (testing::TlsFromEnvironment()) testing::UseTestTls(&c, "server");
  absl::StatusOr<cluster::ServerSecurity> security = cluster::MakeServerSecurity(c);
  EXPECT_TRUE(security.ok()) << security.status();
  return *security;
}

std::vector<float> Input(uint32_t worker) {
  std::vector<float> v(kElements);
  for (size_t i = 0; i < kElements; ++i) v[i] = 0.25f * (worker + 1) * static_cast<float>(i % 97);
  return v;
}

// The f32 mean in worker order, as the shard computes it.
std::vector<float> Mean(uint32_t workers) {
  std::vector<float> m = Input(0);
  for (uint32_t w = 1; w < workers; ++w) {
    std::vector<float> in = Input(w);
    for (size_t i = 0; i < kElements; ++i) m[i] += in[i];
  }
  for (float& x : m) x /= static_cast<float>(workers);
  return m;
}

// The shard is created before its port is known: its config names a placeholder address
// (shards check only the job and epoch), the clients get the real one.
std::unique_ptr<server::ShardService> NewShard(uint32_t workers, uint32_t max_retries) {
  auto shard = server::ShardService::Create(Config(1, workers, max_retries), {0, 2, {}});
  EXPECT_TRUE(shard.ok()) << shard.status();
  return *std::move(shard);
}

TEST(Retry, PushSucceedsOnceTheShardListensAgain) {
  auto shard = NewShard(2, 20);
  server::AggregationGrpcService service(shard.get(), ShardSecurity().token);
  auto first = std::make_unique<Listener>(&service, "127.0.0.1:0");
  const int port = first->port();
  ASSERT_GT(port, 0);
  const proto::ClusterConfig config = Config(port, 2, 20);
  std::vector<std::unique_ptr<worker::Client>> clients;
  for (uint32_t w = 0; w < 2; ++w) {
    auto c = worker::Client::Connect(config, Worker(w));
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->Declare("t", codec::DType::kF32, kElements).ok());
    clients.push_back(*std::move(c));
  }
  first->Stop();  // the shard keeps its state; nothing listens on `port` now

  std::vector<std::vector<float>> in = {Input(0), Input(1)};
  std::vector<std::vector<float>> out(2, std::vector<float>(kElements));
  std::vector<std::future<absl::Status>> done;
  for (uint32_t w = 0; w < 2; ++w) {
    done.push_back(clients[w]->PushPullAsync("t", 0, in[w].data(), out[w].data()));
  }
  absl::SleepFor(absl::Milliseconds(300));
  Listener second(&service, absl::StrCat("127.0.0.1:", port));
  ASSERT_EQ(second.port(), port);
  for (auto& d : done) ASSERT_TRUE(d.get().ok());

  EXPECT_GT(clients[0]->stats().retries + clients[1]->stats().retries, 0u);
  const std::vector<float> mean = Mean(2);
  for (uint32_t w = 0; w < 2; ++w) {
    EXPECT_EQ(0, std::memcmp(out[w].data(), mean.data(), kElements * 4)) << "worker " << w;
  }
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.pushes(), 2u * 3u);  // each worker's 3 chunks arrived once
  EXPECT_EQ(stats.duplicate_pushes(), 0u);
  EXPECT_EQ(stats.steps_completed(), 3u);
  EXPECT_EQ(stats.rejected_pushes(), 0u);
}

// One worker on one shard behind LossyReplies, tensor "t" declared.
struct LossyJob {
  LossyJob(uint32_t max_retries, int lose)
      : shard(NewShard(1, max_retries)),
        service(shard.get(), lose),
        listener(&service, "127.0.0.1:0"),
        client(worker::Client::Connect(Config(listener.port(), 1, max_retries), Worker(0))) {
    EXPECT_TRUE(client.ok()) << client.status();
    if (client.ok()) {
      EXPECT_TRUE((*client)->Declare("t", codec::DType::kF32, kElements).ok());
    }
  }
  std::unique_ptr<server::ShardService> shard;
  LossyReplies service;
  Listener listener;
  absl::StatusOr<std::unique_ptr<worker::Client>> client;
};

TEST(Retry, LostRepliesAreRetriedAndCountedOnce) {
  LossyJob job(5, 2);
  ASSERT_TRUE(job.client.ok());
  worker::Client& client = **job.client;
  std::vector<float> in = Input(0), out(kElements);
  ASSERT_TRUE(client.PushPull("t", 0, in.data(), out.data()).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), Mean(1).data(), kElements * 4));
  EXPECT_EQ(client.stats().retries, 2u);
  proto::StatsResponse stats;
  job.shard->Stats(&stats);
  EXPECT_EQ(stats.steps_completed(), 3u);  // one step per chunk: no double count
  EXPECT_EQ(stats.pushes(), 3u + 2u);
  EXPECT_EQ(stats.duplicate_pushes(), 2u);  // the retries got the cached result
}

// Pull and ResumeStep check what a reply is addressed to, as push-pull does: a reply for
// another key or chunk was decoded into the output when its size matched, and a step of
// 2^63 - 1 overflowed ResumeStep's + 1.
TEST(Retry, MisaddressedPullRepliesAreRefused) {
  LossyJob job(0, 0);
  ASSERT_TRUE(job.client.ok());
  worker::Client& client = **job.client;
  ASSERT_TRUE(client.Declare("u", codec::DType::kF32, kElements).ok());
  std::vector<float> out(kElements, 7.0f);
  ASSERT_TRUE(client.Pull("t", out.data()).ok());
  EXPECT_EQ(*client.ResumeStep("t"), 0);
  struct Case {
    std::function<void(proto::BlockAddress*)> tamper;
    std::string says;
  };
  for (const Case& c : std::vector<Case>{
           {[](proto::BlockAddress* a) { a->set_key("u"); }, "reply addressed to 'u' chunk 0"},
           {[](proto::BlockAddress* a) { a->set_chunk(a->chunk() + 1); }, "chunk 1 step -1"},
           {[](proto::BlockAddress* a) { a->set_step(std::numeric_limits<int64_t>::max()); },
            "step 9223372036854775807"},
           {[](proto::BlockAddress* a) { a->set_step(-2); }, "step -2"}}) {
    job.service.TamperPulls(c.tamper);
    std::fill(out.begin(), out.end(), 7.0f);
    const absl::Status pulled = client.Pull("t", out.data());
    EXPECT_EQ(pulled.code(), absl::StatusCode::kInternal) << pulled;
    EXPECT_THAT(std::string(pulled.message()), HasSubstr(c.says)) << pulled;
    EXPECT_EQ(out[0], 7.0f);  // the first chunk's reply was refused before decoding
    const absl::StatusOr<int64_t> resume = client.ResumeStep("t");
    EXPECT_EQ(resume.status().code(), absl::StatusCode::kInternal) << resume.status();
  }
}

TEST(Retry, ExhaustedBudgetIsUnavailableNamingTheShard) {
  auto shard = NewShard(1, 2);
  server::AggregationGrpcService service(shard.get(), ShardSecurity().token);
  auto listener = std::make_unique<Listener>(&service, "127.0.0.1:0");
  const int port = listener->port();
  auto client = worker::Client::Connect(Config(port, 1, 2), Worker(0));
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Declare("t", codec::DType::kF32, 1000).ok());  // one chunk
  listener->Stop();
  std::vector<float> in(1000, 1.0f), out(1000);
  const absl::Time start = absl::Now();
  absl::Status s = (*client)->PushPull("t", 0, in.data(), out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("127.0.0.1:", port)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard 0"));
  EXPECT_EQ((*client)->stats().retries, 2u);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  proto::StatsResponse stats;
  shard->Stats(&stats);
  EXPECT_EQ(stats.pushes(), 0u);
}

TEST(Retry, ConnectingWhereNoShardRunsSaysSo) {
  // A port nothing listens on: the error names the address and what to check, where it
  // said only "Deadline Exceeded".
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  ::close(fd);  // bound once, then closed: nothing listens there
  proto::ClusterConfig config = Config(port, 1, 0);
  config.set_connect_timeout_ms(500);
  auto client = worker::Client::Connect(config, Worker(0));
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr(absl::StrCat("check that gcomp_server runs at 127.0.0.1:", port)));
}

// A connection attempt that is never answered (a fresh pod's network still being wired)
// is given up after half of connect_timeout_ms and made again on a new connection;
// with gRPC's own 20 s per attempt it would hold Connect past its 4 s.
TEST(Retry, ConnectMakesANewConnectionWhenOneIsNeverAnswered) {
  auto shard = NewShard(1, 2);
  server::AggregationGrpcService service(shard.get(), ShardSecurity().token);
  Listener listener(&service, "127.0.0.1:0");
  BlackHoleFirstConnection proxy(listener.port());
  ASSERT_GT(proxy.port(), 0);
  proto::ClusterConfig config = Config(proxy.port(), 1, 2);
  config.set_connect_timeout_ms(4000);
  auto client = worker::Client::Connect(config, Worker(0));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_GE(proxy.accepted(), 2);
  ASSERT_TRUE((*client)->Declare("t", codec::DType::kF32, kElements).ok());
  std::vector<float> in = Input(0), out(kElements);
  ASSERT_TRUE((*client)->PushPull("t", 0, in.data(), out.data()).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), Mean(1).data(), kElements * 4));
}

}  // namespace
}  // namespace gcomp
