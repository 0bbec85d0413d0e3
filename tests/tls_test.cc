// Mutual TLS and the job token over real gRPC on loopback (docs/SERVICE.md, "Security"):
// clients without a valid certificate or token are refused with the right status and
// change nothing on the shard; the right certificate and token run a step; the plaintext
// health port serves health only; renewed certificates and tokens are picked up from disk.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "gtest/gtest.h"
#include "tests/free_port.h"
#include "proto/aggregation.grpc.pb.h"
#include "proto/grpc_health.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "server/grpc_service.h"
#include "tests/test_certs.h"
#include "worker/client.h"

namespace gcomp {
namespace {

using ::testing::HasSubstr;
using testing::TestCert;
using testing::TestCertsDir;

// A port nobody listens on right now (the kernel's next free one).
using testing::FreePort;

std::string Copy(const std::string& from, const std::string& to) {
  absl::StatusOr<std::string> bytes = ReadFile(from);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_TRUE(WriteFileAtomically(to, *bytes).ok());
  return to;
}

std::chrono::system_clock::time_point Soon() {
  return std::chrono::system_clock::now() + std::chrono::seconds(5);
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // The shard's own copies of its certificate, key and token, so tests can replace them.
    dir_ = absl::StrCat(TestCertsDir(), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(std::system(absl::StrCat("mkdir -p ", dir_).c_str()), 0);
    absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig(
        "job: tls\n", {"workers=1", "shards=127.0.0.1:1", "uplink.mode=none",
                       "downlink.mode=none", "security.cert_refresh_s=1"});
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    proto::SecurityConfig* sec = config_.mutable_security();
    sec->set_ca_file(TestCert("ca.pem"));
    sec->set_cert_file(Copy(TestCert("server.pem"), dir_ + "/server.pem"));
    sec->set_key_file(Copy(TestCert("server.key"), dir_ + "/server.key"));
    sec->set_token_file(Copy(TestCert("token"), dir_ + "/token"));
    sec->set_health_port(FreePort());
    ASSERT_TRUE(cluster::ValidateClusterConfig(config_).ok());
    auto server = server::ShardServer::Start(config_, {0, 1, {}}, "127.0.0.1:0");
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    config_.set_shards(0, address_);
    before_ = ShardStats();
  }

  // A worker's config: the shard's, with the `identity` certificate and `token_file`.
  proto::ClusterConfig ClientConfig(const std::string& identity, const std::string& token_file) {
    proto::ClusterConfig c = config_;
    c.mutable_security()->set_cert_file(TestCert(identity + ".pem"));
    c.mutable_security()->set_key_file(TestCert(identity + ".key"));
    c.mutable_security()->set_token_file(token_file);
    return c;
  }

  std::shared_ptr<grpc::Channel> Channel(const proto::ClusterConfig& client,
                                         const grpc::ChannelArguments& args = {}) {
    absl::StatusOr<cluster::ClientSecurity> sec = cluster::MakeClientSecurity(client);
    EXPECT_TRUE(sec.ok()) << sec.status();
    return sec->NewChannel(address_, args);
  }

  // Calls every Aggregation and Admin method once; their statuses.
  std::vector<grpc::Status> CallEverything(const std::shared_ptr<grpc::Channel>& channel) {
    auto agg = proto::Aggregation::NewStub(channel);
    auto admin = proto::Admin::NewStub(channel);
    std::vector<grpc::Status> out;
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(Soon());
      proto::RegisterWorkerRequest req;
      req.set_job("tls");
      req.set_shard_map_epoch(1);
      proto::RegisterWorkerResponse resp;
      out.push_back(agg->RegisterWorker(&ctx, req, &resp));
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(Soon());
      proto::DeclareTensorRequest req;
      req.set_job("tls");
      req.set_key("t");
      req.set_dtype(proto::DTYPE_F32);
      req.set_elements(4);
      req.set_shard_map_epoch(1);
      proto::DeclareTensorResponse resp;
      out.push_back(agg->DeclareTensor(&ctx, req, &resp));
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(Soon());
      proto::CompressedBlock req, resp;
      req.mutable_address()->set_job("tls");
      req.mutable_address()->set_key("t");
      req.mutable_address()->set_shard_map_epoch(1);
      out.push_back(agg->PushPull(&ctx, req, &resp));
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(Soon());
      proto::PullRequest req;
      req.set_job("tls");
      req.set_key("t");
      req.set_shard_map_epoch(1);
      proto::CompressedBlock resp;
      out.push_back(agg->Pull(&ctx, req, &resp));
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(Soon());
      proto::StatsResponse resp;
      out.push_back(agg->Stats(&ctx, proto::StatsRequest(), &resp));
    }
    {
      grpc::ClientContext ctx;
      ctx.set_deadline(Soon());
      proto::PingResponse resp;
      out.push_back(admin->Ping(&ctx, proto::PingRequest(), &resp));
    }
    return out;
  }

  void ExpectAllRefused(const std::shared_ptr<grpc::Channel>& channel, grpc::StatusCode code,
                        const std::string& message_part = "") {
    const std::vector<grpc::Status> statuses = CallEverything(channel);
    ASSERT_EQ(statuses.size(), 6u);
    for (size_t i = 0; i < statuses.size(); ++i) {
      EXPECT_EQ(statuses[i].error_code(), code)
          << "call " << i << ": " << statuses[i].error_message();
      EXPECT_THAT(statuses[i].error_message(), HasSubstr(message_part)) << "call " << i;
    }
    ExpectShardUnchanged();
  }

  proto::StatsResponse ShardStats() {
    proto::StatsResponse s;
    server_->service()->Stats(&s);
    return s;
  }

  void ExpectShardUnchanged() {
    const proto::StatsResponse now = ShardStats();
    google::protobuf::util::MessageDifferencer differ;
    // Every counter and gauge, but not the clock.
    for (const char* clock : {"uptime_ms"}) {
      const auto* field = proto::StatsResponse::descriptor()->FindFieldByName(clock);
      if (field != nullptr) differ.IgnoreField(field);
    }
    EXPECT_TRUE(differ.Compare(before_, now))
        << "before: " << before_.ShortDebugString() << "\nnow: " << now.ShortDebugString();
    EXPECT_EQ(now.tensors(), 0u);
    EXPECT_EQ(now.pushes(), 0u);
  }

  grpc::health::v1::HealthCheckResponse::ServingStatus Health(
      const std::shared_ptr<grpc::Channel>& channel, const std::string& service, grpc::Status* s) {
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    *s = grpc::health::v1::Health::NewStub(channel)->Check(&ctx, req, &resp);
    return resp.status();
  }

  // The common name of the certificate the shard presented for a call on `channel`; the
  // call's status in `status`, or expected OK without it.
  std::string ServerName(const std::shared_ptr<grpc::Channel>& channel,
                         grpc::Status* status = nullptr) {
    auto stub = proto::Aggregation::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(Soon());
    proto::StatsResponse resp;
    grpc::Status s = stub->Stats(&ctx, proto::StatsRequest(), &resp);
    if (status != nullptr) {
      *status = s;
    } else {
      EXPECT_TRUE(s.ok()) << s.error_message();
    }
    std::shared_ptr<const grpc::AuthContext> auth = ctx.auth_context();
    if (auth == nullptr) return "";
    std::vector<grpc::string_ref> cn = auth->FindPropertyValues("x509_common_name");
    return cn.empty() ? "" : std::string(cn[0].data(), cn[0].size());
  }

  std::string dir_;
  proto::ClusterConfig config_;
  std::unique_ptr<server::ShardServer> server_;
  std::string address_;
  proto::StatsResponse before_;
};

TEST_F(TlsTest, ValidCertificateAndTokenRunAStepThroughTheClient) {
  const proto::ClusterConfig client_config = ClientConfig("client", TestCert("token"));
  auto client = worker::Client::Connect(client_config, worker::ClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<float> in = {1.5f, -2.0f, 0.25f, 8.0f}, out(4);
  ASSERT_TRUE((*client)->Declare("t", codec::DType::kF32, in.size()).ok());
  ASSERT_TRUE((*client)->PushPull("t", 0, in.data(), out.data()).ok());
  EXPECT_EQ(out, in);  // the mean of one worker
  EXPECT_EQ(ShardStats().pushes(), 1u);
  EXPECT_EQ(ShardStats().tensors(), 1u);
}

TEST_F(TlsTest, NoClientCertificateIsRefused) {
  // Verifies the shard against the CA but presents nothing.
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(
      std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(TestCert("ca.pem"), 1));
  options.watch_root_certs();
  cluster::ClientSecurity sec;
  sec.credentials = grpc::experimental::TlsCredentials(options);
  auto token = cluster::JobToken::Load(TestCert("token"));
  ASSERT_TRUE(token.ok());
  sec.token = *token;
  ExpectAllRefused(sec.NewChannel(address_), grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, CertificateFromAnotherCaIsRefused) {
  ExpectAllRefused(Channel(ClientConfig("other_client", TestCert("token"))),
                   grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, ExpiredCertificateIsRefused) {
  ExpectAllRefused(Channel(ClientConfig("expired_client", TestCert("token"))),
                   grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, TheClientLibraryReportsAFailedHandshakeAtConnect) {
  proto::ClusterConfig c = ClientConfig("other_client", TestCert("token"));
  c.set_connect_timeout_ms(500);
  auto client = worker::Client::Connect(c, worker::ClientOptions());
  ASSERT_FALSE(client.ok());
  // Connect waits for the shard to come up, so a refused handshake looks like a shard that
  // never answered; the message names the shard.
  EXPECT_EQ(client.status().code(), absl::StatusCode::kDeadlineExceeded) << client.status();
  EXPECT_THAT(std::string(client.status().message()), HasSubstr(address_));
  ExpectShardUnchanged();
}

TEST_F(TlsTest, PlaintextClientIsRefused) {
  ExpectAllRefused(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()),
                   grpc::StatusCode::UNAVAILABLE);
}

TEST_F(TlsTest, ValidCertificateWithoutTokenIsUnauthenticated) {
  ExpectAllRefused(Channel(ClientConfig("client", "")), grpc::StatusCode::UNAUTHENTICATED,
                   "no job token");
}

TEST_F(TlsTest, ValidCertificateWithAnotherJobsTokenIsPermissionDenied) {
  const std::string other = dir_ + "/other_token";
  ASSERT_TRUE(WriteFileAtomically(other, "another-jobs-token\n").ok());
  ExpectAllRefused(Channel(ClientConfig("client", other)), grpc::StatusCode::PERMISSION_DENIED,
                   "not this job's");
  // The client library reports it too, at Connect.
  auto client = worker::Client::Connect(ClientConfig("client", other), worker::ClientOptions());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kPermissionDenied) << client.status();
  ExpectShardUnchanged();
}

TEST_F(TlsTest, RefusalsNeverEchoTheToken) {
  const std::string other = dir_ + "/other_token";
  ASSERT_TRUE(WriteFileAtomically(other, "zz-secret-guess-zz").ok());
  for (const grpc::Status& s : CallEverything(Channel(ClientConfig("client", other)))) {
    EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr("zz-secret-guess-zz")));
  }
}

TEST_F(TlsTest, HealthNeedsNoTokenOnTheTlsPort) {
  grpc::Status s;
  EXPECT_EQ(Health(Channel(ClientConfig("client", "")), "gcomp.proto.Aggregation", &s),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

TEST_F(TlsTest, HealthPortServesHealthInPlaintextAndNothingElse) {
  ASSERT_EQ(server_->health_port(), static_cast<int>(config_.security().health_port()));
  auto plain = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->health_port()),
                                   grpc::InsecureChannelCredentials());
  for (const std::string service : {"", "gcomp.proto.Aggregation"}) {
    grpc::Status s;
    EXPECT_EQ(Health(plain, service, &s), grpc::health::v1::HealthCheckResponse::SERVING)
        << "'" << service << "'";
    EXPECT_TRUE(s.ok()) << s.error_message();
  }
  // Aggregation and Admin are not there, not even with the token.
  auto token = cluster::JobToken::Load(TestCert("token"));
  ASSERT_TRUE(token.ok());
  cluster::ClientSecurity with_token{false, grpc::InsecureChannelCredentials(), *token};
  ExpectAllRefused(with_token.NewChannel(absl::StrCat("127.0.0.1:", server_->health_port())),
                   grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(TlsTest, HealthPortReportsNotServingOnceShutdownBegins) {
  auto plain = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->health_port()),
                                   grpc::InsecureChannelCredentials());
  grpc::Status s;
  ASSERT_EQ(Health(plain, "", &s), grpc::health::v1::HealthCheckResponse::SERVING);
  server_->Shutdown(absl::ZeroDuration());
  EXPECT_NE(Health(plain, "", &s), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(TlsTest, ShardCertificateCoversTheNamesInItsSubjectAltName) {
  // The client checks the dialled name against the certificate's subjectAltName.
  for (const std::string name : {"localhost", "gcomp-shard-3.gcomp-shard",
                                  "gcomp-shard-3.gcomp-shard.default.svc"}) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride(name);
    grpc::Status s;
    EXPECT_EQ(Health(Channel(ClientConfig("client", TestCert("token")), args), "", &s),
              grpc::health::v1::HealthCheckResponse::SERVING)
        << name;
    EXPECT_TRUE(s.ok()) << name << ": " << s.error_message();
  }
  // Not in it: another domain, and a shard beyond the listed 0..15.
  for (const std::string name : {"shard-3.elsewhere.example", "gcomp-shard-16.gcomp-shard"}) {
    grpc::ChannelArguments args;
    args.SetSslTargetNameOverride(name);
    ExpectAllRefused(Channel(ClientConfig("client", TestCert("token")), args),
                     grpc::StatusCode::UNAVAILABLE);
  }
}

TEST_F(TlsTest, RenewedShardCertificateIsUsedForNewConnections) {
  const proto::ClusterConfig client = ClientConfig("client", TestCert("token"));
  EXPECT_EQ(ServerName(Channel(client)), "gcomp shard");
  // As a Secret update does: new files replace the old ones.
  Copy(TestCert("server_renewed.key"), config_.security().key_file());
  Copy(TestCert("server_renewed.pem"), config_.security().cert_file());
  std::string name;
  for (int i = 0; i < 40 && name != "gcomp shard (renewed)"; ++i) {
    absl::SleepFor(absl::Milliseconds(250));
    name = ServerName(Channel(client));  // a new channel, a new handshake
  }
  EXPECT_EQ(name, "gcomp shard (renewed)");
}

// What docs/SERVICE.md warns about: gRPC 1.51's file watcher loads a key and certificate
// that do not match, so between the two halves of an update new handshakes fail.
TEST_F(TlsTest, AHalfWrittenUpdateFailsNewHandshakesUntilItIsComplete) {
  const proto::ClusterConfig client = ClientConfig("client", TestCert("token"));
  EXPECT_EQ(ServerName(Channel(client)), "gcomp shard");
  Copy(TestCert("server_renewed.key"), config_.security().key_file());  // the new key only
  grpc::Status s;
  for (int i = 0; i < 40 && s.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(250));
    ServerName(Channel(client), &s);
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
  Copy(TestCert("server_renewed.pem"), config_.security().cert_file());
  std::string name;
  for (int i = 0; i < 40 && name != "gcomp shard (renewed)"; ++i) {
    absl::SleepFor(absl::Milliseconds(250));
    name = ServerName(Channel(client), &s);
  }
  EXPECT_EQ(name, "gcomp shard (renewed)");
}

TEST_F(TlsTest, ChangedTokenFileIsPickedUp) {
  const proto::ClusterConfig old_token = ClientConfig("client", TestCert("token"));
  ASSERT_TRUE(CallEverything(Channel(old_token))[4].ok());  // Stats
  const std::string fresh = dir_ + "/fresh_token";
  ASSERT_TRUE(WriteFileAtomically(fresh, "the-new-token\n").ok());
  Copy(fresh, config_.security().token_file());
  grpc::Status s;
  for (int i = 0; i < 40; ++i) {
    absl::SleepFor(absl::Milliseconds(250));
    s = CallEverything(Channel(old_token))[4];
    if (!s.ok()) break;
  }
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  EXPECT_TRUE(CallEverything(Channel(ClientConfig("client", fresh)))[4].ok());
}

TEST(InsecureWithToken, TheTokenIsStillChecked) {
  const std::string token_file = Copy(TestCert("token"), TestCertsDir() + "/insecure_token");
  absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig(
      "job: tls\n", {"workers=1", "shards=127.0.0.1:1", "security.token_file=" + token_file});
  ASSERT_TRUE(config.ok()) << config.status();
  auto server = server::ShardServer::Start(*config, {0, 1, {}}, "127.0.0.1:0");
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->health_port(), 0);
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  proto::StatsResponse stats;
  {
    auto stub = proto::Aggregation::NewStub(
        grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    EXPECT_EQ(stub->Stats(&ctx, proto::StatsRequest(), &stats).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  config->set_shards(0, address);
  auto client = worker::Client::Connect(*config, worker::ClientOptions());
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_TRUE((*client)->Declare("t", codec::DType::kF32, 3).ok());
}

TEST(ServerSecurityErrors, AMissingCertificateFileFailsStart) {
  absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig(
      "job: tls\n", {"shards=127.0.0.1:1", "security.ca_file=" + TestCert("ca.pem"),
                     "security.cert_file=" + TestCertsDir() + "/nope.pem",
                     "security.key_file=" + TestCert("server.key")});
  ASSERT_TRUE(config.ok()) << config.status();
  auto server = server::ShardServer::Start(*config, {0, 1, {}}, "127.0.0.1:0");
  EXPECT_EQ(server.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("security.cert_file"));
}

}  // namespace
}  // namespace gcomp
