#include "cluster/credentials.h"

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "base/files.h"
#include "cluster/cluster_config.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/health.grpc.pb.h"

namespace gcomp::cluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

// tools/make_test_certs.sh into TEST_TMPDIR/certs, once.
const std::string& Certs() {
  static const std::string* dir = [] {
    auto* d = new std::string(TempDir() + "/certs");
    const std::string cmd = absl::StrCat("tools/make_test_certs.sh ", *d);
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    return d;
  }();
  return *dir;
}

proto::ClusterConfig Config(const std::vector<std::string>& overrides) {
  std::vector<std::string> all = {"shards=127.0.0.1:1"};
  all.insert(all.end(), overrides.begin(), overrides.end());
  absl::StatusOr<proto::ClusterConfig> c = ParseClusterConfig("job: creds\n", all);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

std::vector<std::string> Tls(const std::string& ca = "ca.pem") {
  return {"security.ca_file=" + Certs() + "/" + ca, "security.cert_file=" + Certs() + "/server.pem",
          "security.key_file=" + Certs() + "/server.key"};
}

TEST(Credentials, WithoutSecurityEverythingIsInsecureAndUnchecked) {
  const proto::ClusterConfig config = Config({});
  auto server = MakeServerSecurity(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_FALSE(server->tls);
  EXPECT_NE(server->credentials, nullptr);
  EXPECT_EQ(server->token, nullptr);
  auto client = MakeClientSecurity(config);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_FALSE(client->tls);
  EXPECT_EQ(client->token, nullptr);
  EXPECT_NE(client->NewChannel("127.0.0.1:1"), nullptr);
  EXPECT_THAT(DescribeSecurity(config), HasSubstr("INSECURE"));
}

TEST(Credentials, TlsFilesMakeTlsCredentialsOnBothEnds) {
  const proto::ClusterConfig config = Config(Tls());
  auto server = MakeServerSecurity(config);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_TRUE(server->tls);
  EXPECT_NE(server->credentials, nullptr);
  auto client = MakeClientSecurity(config);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE(client->tls);
  EXPECT_NE(client->credentials, nullptr);
  const std::string d = DescribeSecurity(config);
  EXPECT_THAT(d, HasSubstr("mutual TLS"));
  EXPECT_THAT(d, Not(HasSubstr("INSECURE")));
}

TEST(Credentials, AMissingTlsFileIsNotFoundNamingFieldAndPath) {
  for (const char* field : {"ca_file", "cert_file", "key_file"}) {
    std::vector<std::string> o = Tls();
    const std::string missing = Certs() + "/missing.pem";
    o.push_back(absl::StrCat("security.", field, "=", missing));
    const proto::ClusterConfig config = Config(o);
    for (const absl::Status& s :
         {MakeServerSecurity(config).status(), MakeClientSecurity(config).status()}) {
      EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr(absl::StrCat("security.", field)));
      EXPECT_THAT(std::string(s.message()), HasSubstr(missing));
    }
  }
}

TEST(Credentials, AFileWithoutPemIsFailedPrecondition) {
  const std::string junk = TempDir() + "/junk.pem";
  ASSERT_TRUE(WriteFileAtomically(junk, "not a certificate\n").ok());
  std::vector<std::string> o = Tls();
  o.push_back("security.cert_file=" + junk);
  absl::Status s = MakeServerSecurity(Config(o)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("security.cert_file"));
}

TEST(Credentials, TheTokenIsLoadedForBothEndsAndNeverDescribed) {
  std::vector<std::string> o = Tls();
  o.push_back("security.token_file=" + Certs() + "/token");
  const proto::ClusterConfig config = Config(o);
  auto server = MakeServerSecurity(config);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_NE(server->token, nullptr);
  auto client = MakeClientSecurity(config);
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_NE(client->token, nullptr);
  const std::string header = client->token->Header();
  EXPECT_TRUE(server->token->Check({header}).ok());
  const std::string token = header.substr(7);
  EXPECT_THAT(DescribeSecurity(config), Not(HasSubstr(token)));
  EXPECT_THAT(DescribeSecurity(config), HasSubstr("job token from"));
}

TEST(Credentials, AMissingTokenFileIsNotFound) {
  const proto::ClusterConfig config = Config({"security.token_file=" + TempDir() + "/nope"});
  EXPECT_EQ(MakeServerSecurity(config).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(MakeClientSecurity(config).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(DescribeSecurity(config), HasSubstr("sent in the clear"));
}

// A peer that answers gzip-compressed whatever the client asked for: 16 MiB of 'a' that
// travels as about 16 KiB.
class GzipBomb final : public proto::Admin::Service {
 public:
  static constexpr size_t kInflated = 16 << 20;
  grpc::Status Ping(grpc::ServerContext* ctx, const proto::PingRequest*,
                    proto::PingResponse* out) override {
    ctx->set_compression_algorithm(GRPC_COMPRESS_GZIP);
    out->set_process(std::string(kInflated, 'a'));
    return grpc::Status::OK;
  }
};

TEST(Credentials, ClientChannelsRefuseCompressedResponses) {
  GzipBomb service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(-1);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const std::string target = absl::StrCat("127.0.0.1:", port);
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto ping = [&](const std::shared_ptr<grpc::Channel>& channel, proto::PingResponse* out) {
    grpc::ClientContext ctx;
    return proto::Admin::NewStub(channel)->Ping(&ctx, proto::PingRequest(), out);
  };

  // A plain channel takes the compressed answer and inflates it: the peer really sends gzip.
  proto::PingResponse plain;
  const grpc::Status inflated =
      ping(grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args), &plain);
  ASSERT_TRUE(inflated.ok()) << inflated.error_message();
  EXPECT_EQ(plain.process().size(), GzipBomb::kInflated);

  auto client = MakeClientSecurity(Config({}));
  ASSERT_TRUE(client.ok()) << client.status();
  proto::PingResponse refused;
  const grpc::Status s = ping(client->NewChannel(target, args), &refused);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.error_message(), HasSubstr("gzip")) << s.error_code();
  EXPECT_TRUE(refused.process().empty());
  server->Shutdown();
}

}  // namespace
}  // namespace gcomp::cluster
