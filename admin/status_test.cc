#include "admin/status.h"

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/files.h"
#include "cluster/cluster_config.h"
#include "gtest/gtest.h"
#include "server/grpc_service.h"

namespace gcomp::admin {
namespace {

// Two real shards on loopback ports and the config an operator would hold for them.
class StatusTest : public ::testing::Test {
 protected:
  // `server_overrides` go into the shards' config, `admin_overrides` into the admin's.
  void StartShards(const std::vector<std::string>& server_overrides = {}) {
    std::vector<std::string> overrides = {"shards=127.0.0.1:1,127.0.0.1:2"};
    overrides.insert(overrides.end(), server_overrides.begin(), server_overrides.end());
    absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig("job: ops\n", overrides);
    ASSERT_TRUE(config.ok()) << config.status();
    for (uint32_t k = 0; k < 2; ++k) {
      auto server = server::ShardServer::Start(*config, {k, 1, {}}, "127.0.0.1:0");
      ASSERT_TRUE(server.ok()) << server.status();
      servers_.push_back(*std::move(server));
    }
  }

  proto::ClusterConfig AdminConfig(std::vector<std::string> overrides = {}) {
    overrides.push_back(absl::StrCat("shards=127.0.0.1:", servers_[0]->port(), ",127.0.0.1:",
                                     servers_[1]->port()));
    absl::StatusOr<proto::ClusterConfig> config = cluster::ParseClusterConfig("job: ops\n", overrides);
    EXPECT_TRUE(config.ok()) << config.status();
    return *config;
  }

  // Declares a tensor on both shards; returns how many chunks the shards own in all.
  size_t Declare(const std::string& key, uint64_t elements) {
    size_t owned = 0;
    for (auto& server : servers_) {
      proto::DeclareTensorRequest d;
      d.set_job("ops");
      d.set_key(key);
      d.set_dtype(proto::DTYPE_F32);
      d.set_elements(elements);
      d.set_shard_map_epoch(server->service()->config().shard_map_epoch());
      proto::DeclareTensorResponse r;
      absl::Status s = server->service()->DeclareTensor(d, &r);
      EXPECT_TRUE(s.ok()) << s;
      owned += r.owned_chunks_size();
    }
    return owned;
  }

  std::string TokenFile(const std::string& token) {
    const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/token-", token);
    EXPECT_TRUE(WriteFileAtomically(path, token + "\n").ok());
    return path;
  }

  std::vector<std::unique_ptr<server::ShardServer>> servers_;
};

TEST_F(StatusTest, EveryShardUpWithItsNumbersAndLastError) {
  StartShards();
  const size_t chunks = Declare("w", 1 << 20);
  ASSERT_GT(chunks, 1u);
  // A push the shard rejects becomes shard 0's last error.
  proto::CompressedBlock bad;
  bad.mutable_address()->set_job("ops");
  bad.mutable_address()->set_key("no-such-key");
  bad.mutable_address()->set_shard_map_epoch(1);
  proto::CompressedBlock reply;
  ASSERT_FALSE(servers_[0]->service()->PushPull(bad, absl::Now() + absl::Seconds(1), &reply).ok());

  absl::StatusOr<ClusterStatus> status = CollectStatus(AdminConfig(), {});
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->shards.size(), 2u);
  EXPECT_TRUE(status->all_up());
  uint64_t owned = 0;
  for (uint32_t k = 0; k < 2; ++k) {
    const ShardStatus& row = status->shards[k];
    EXPECT_TRUE(row.up()) << row.error;
    EXPECT_EQ(row.shard, k);
    EXPECT_EQ(row.address, absl::StrCat("127.0.0.1:", servers_[k]->port()));
    EXPECT_EQ(row.stats.shard(), k);
    EXPECT_EQ(row.stats.tensors(), 1u);
    EXPECT_EQ(row.stats.shard_map_epoch(), 1u);
    EXPECT_GT(row.stats.memory_used_bytes(), 0u);
    owned += row.stats.chunks_owned();
  }
  EXPECT_EQ(owned, chunks);
  EXPECT_EQ(status->shards[0].stats.rejected_pushes(), 1u);
  EXPECT_NE(status->shards[0].stats.last_error().find("NOT_FOUND"), std::string::npos)
      << status->shards[0].stats.last_error();
  EXPECT_NE(status->shards[0].stats.last_error().find("no-such-key"), std::string::npos);
  EXPECT_EQ(status->shards[1].stats.last_error(), "");

  const std::string table = FormatStatusTable(*status);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << table;
  EXPECT_EQ(lines[0].find("shard"), 0u) << table;
  EXPECT_EQ(table.find("DOWN"), std::string::npos) << table;
  EXPECT_NE(lines[1].find("  up  "), std::string::npos) << table;
  EXPECT_NE(lines[1].find("no-such-key"), std::string::npos) << table;
  const std::string json = FormatStatusJson(*status);
  EXPECT_NE(json.find("\"all_up\":true}"), std::string::npos) << json;
  EXPECT_NE(json.find("\"tensors\":1,"), std::string::npos) << json;
}

TEST_F(StatusTest, LongLastErrorIsCutOnACharacterBoundary) {
  StartShards();
  // "NOT_FOUND: unknown tensor key '" is 31 bytes, then 2-byte characters: byte 200 falls
  // inside one. A cut there would make the string invalid UTF-8 and the Stats call fail.
  std::string key;
  for (int i = 0; i < 150; ++i) key += "\xc3\xa9";
  proto::CompressedBlock bad;
  bad.mutable_address()->set_job("ops");
  bad.mutable_address()->set_key(key);
  bad.mutable_address()->set_shard_map_epoch(1);
  proto::CompressedBlock reply;
  ASSERT_FALSE(servers_[0]->service()->PushPull(bad, absl::Now() + absl::Seconds(1), &reply).ok());

  absl::StatusOr<ClusterStatus> status = CollectStatus(AdminConfig(), {});
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_TRUE(status->shards[0].up()) << status->shards[0].error;
  const std::string& last = status->shards[0].stats.last_error();
  EXPECT_EQ(last.size(), 199u) << last;
  EXPECT_EQ(last.substr(0, 31), "NOT_FOUND: unknown tensor key '");
  EXPECT_EQ(last.substr(last.size() - 2), "\xc3\xa9");
}

TEST_F(StatusTest, StoppedShardIsDownWithTheGrpcError) {
  StartShards();
  const proto::ClusterConfig config = AdminConfig();
  servers_[1]->Shutdown(absl::Milliseconds(100));
  servers_[1].reset();

  const absl::Time start = absl::Now();
  absl::StatusOr<ClusterStatus> status = CollectStatus(config, {.timeout_ms = 2000});
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  EXPECT_FALSE(status->all_up());
  EXPECT_TRUE(status->shards[0].up()) << status->shards[0].error;
  const ShardStatus& down = status->shards[1];
  EXPECT_FALSE(down.up());
  EXPECT_EQ(down.error.code(), absl::StatusCode::kUnavailable) << down.error;

  const std::string table = FormatStatusTable(*status);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << table;
  EXPECT_NE(lines[1].find(" up "), std::string::npos) << table;
  EXPECT_NE(lines[2].find(" DOWN "), std::string::npos) << table;
  EXPECT_NE(lines[2].find("UNAVAILABLE: "), std::string::npos) << table;
  const std::string json = FormatStatusJson(*status);
  EXPECT_NE(json.find("\"up\":false,\"error_code\":\"UNAVAILABLE\",\"error\":"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"all_up\":false}"), std::string::npos) << json;
}

TEST_F(StatusTest, TimeoutsOutOfRangeAreRefused) {
  // INT64_MAX ms overflowed the deadline: every shard read as down at once.
  StartShards();
  for (int64_t ms : {int64_t{0}, int64_t{-5}, int64_t{24} * 3600 * 1000 + 1, INT64_MAX}) {
    absl::StatusOr<ClusterStatus> status = CollectStatus(AdminConfig(), {.timeout_ms = ms});
    EXPECT_EQ(status.status().code(), absl::StatusCode::kInvalidArgument) << ms;
    EXPECT_NE(status.status().message().find(absl::StrCat("got ", ms)), std::string::npos)
        << status.status();
  }
}

TEST_F(StatusTest, CallsCarryTheConfigsJobToken) {
  const std::string token = TokenFile("s3cret-token");
  StartShards({absl::StrCat("security.token_file=", token)});

  absl::StatusOr<ClusterStatus> with =
      CollectStatus(AdminConfig({absl::StrCat("security.token_file=", token)}), {});
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_TRUE(with->all_up()) << with->shards[0].error;

  absl::StatusOr<ClusterStatus> without = CollectStatus(AdminConfig(), {});
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_FALSE(without->all_up());
  EXPECT_EQ(without->shards[0].error.code(), absl::StatusCode::kUnauthenticated)
      << without->shards[0].error;

  absl::StatusOr<ClusterStatus> wrong =
      CollectStatus(AdminConfig({absl::StrCat("security.token_file=", TokenFile("other"))}), {});
  ASSERT_TRUE(wrong.ok()) << wrong.status();
  EXPECT_EQ(wrong->shards[1].error.code(), absl::StatusCode::kPermissionDenied)
      << wrong->shards[1].error;
  const std::string table = FormatStatusTable(*wrong) + FormatStatusJson(*wrong);
  EXPECT_EQ(table.find("s3cret"), std::string::npos) << table;
}

TEST_F(StatusTest, MutualTlsShardsAnswerOnlyAClientWithACertificateFromTheirCa) {
  // tools/make_test_certs.sh's PKI: shard and client certificates from one CA.
  const std::string certs = absl::StrCat(std::getenv("TEST_TMPDIR"), "/certs");
  ASSERT_EQ(std::system(absl::StrCat("tools/make_test_certs.sh ", certs).c_str()), 0);
  auto tls = [&](const std::string& identity) {
    return std::vector<std::string>{
        absl::StrCat("security.ca_file=", certs, "/ca.pem"),
        absl::StrCat("security.cert_file=", certs, "/", identity, ".pem"),
        absl::StrCat("security.key_file=", certs, "/", identity, ".key"),
        absl::StrCat("security.token_file=", certs, "/token")};
  };
  StartShards(tls("server"));

  absl::StatusOr<ClusterStatus> ok = CollectStatus(AdminConfig(tls("client")), {});
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(ok->all_up()) << ok->shards[0].error << " / " << ok->shards[1].error;

  // A certificate from another CA: the handshake fails, the rows are down, nothing hangs.
  const absl::Time start = absl::Now();
  absl::StatusOr<ClusterStatus> other =
      CollectStatus(AdminConfig(tls("other_client")), {.timeout_ms = 2000});
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(3));
  for (const ShardStatus& row : other->shards) {
    EXPECT_EQ(row.error.code(), absl::StatusCode::kUnavailable) << row.error;
  }
}

TEST_F(StatusTest, AShardAtAnotherShardsAddressIsDown) {
  StartShards();
  proto::ClusterConfig config = AdminConfig();
  config.set_shards(0, absl::StrCat("127.0.0.1:", servers_[1]->port()));
  config.set_shards(1, absl::StrCat("127.0.0.1:", servers_[0]->port()));
  absl::StatusOr<ClusterStatus> status = CollectStatus(config, {});
  ASSERT_TRUE(status.ok()) << status.status();
  for (const ShardStatus& row : status->shards) {
    EXPECT_EQ(row.error.code(), absl::StatusCode::kFailedPrecondition) << row.error;
  }
  EXPECT_NE(status->shards[0].error.message().find("is shard 1"), std::string::npos)
      << status->shards[0].error;
}

TEST(CollectStatus, RejectsBadOptionsAndMissingCredentials) {
  absl::StatusOr<proto::ClusterConfig> config =
      cluster::ParseClusterConfig("job: ops\n", {"shards=127.0.0.1:1"});
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(CollectStatus(*config, {.timeout_ms = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  config->mutable_security()->set_token_file("/nonexistent/token");
  const absl::Status missing = CollectStatus(*config, {}).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("/nonexistent/token"), std::string::npos) << missing;
}

TEST(HumanBytes, PicksTheLargestUnitBelow1024) {
  EXPECT_EQ(HumanBytes(0), "0 B");
  EXPECT_EQ(HumanBytes(1023), "1023 B");
  EXPECT_EQ(HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(HumanBytes(uint64_t{12} << 20), "12.0 MiB");
  EXPECT_EQ(HumanBytes(uint64_t{5} << 30), "5.0 GiB");
  EXPECT_EQ(HumanBytes(uint64_t{3} << 40), "3.0 TiB");
}

TEST(FormatStatusTable, AlignsColumnsAndShowsUnitsAndRatio) {
  ClusterStatus status;
  ShardStatus a;
  a.shard = 0;
  a.address = "shard-0.gcomp:7070";
  a.stats.set_shard_map_epoch(3);
  a.stats.set_chunks_owned(128);
  a.stats.set_tensors(12);
  a.stats.set_steps_completed(123456);
  a.stats.set_bytes_in(uint64_t{100} << 20);
  a.stats.set_bytes_out(uint64_t{50} << 20);
  a.stats.set_raw_bytes_in(uint64_t{400} << 20);
  a.stats.set_raw_bytes_out(uint64_t{200} << 20);
  a.stats.set_memory_used_bytes(uint64_t{3} << 29);
  a.stats.set_memory_budget_bytes(uint64_t{8} << 30);
  // A peer's key: a line break, a screen clear (ESC [ and its one-byte form U+009B) and a
  // right-to-left override reach the terminal escaped.
  a.stats.set_last_error(
      "INVALID_ARGUMENT: line\nbreak \x1b[2J \xc2\x9b"
      "2J \xe2\x80\xae");
  ShardStatus b;
  b.shard = 1;
  b.address = "shard-1.gcomp:7070";
  b.error = absl::UnavailableError("failed to connect to all addresses");
  status.shards = {a, b};

  const std::string table = FormatStatusTable(status);
  const std::vector<std::string> lines = absl::StrSplit(table, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << table;
  EXPECT_NE(lines[1].find("100.0 MiB"), std::string::npos) << table;
  EXPECT_NE(lines[1].find("4.00x"), std::string::npos) << table;
  EXPECT_NE(lines[1].find("1.5 GiB/8.0 GiB"), std::string::npos) << table;
  EXPECT_NE(lines[1].find("INVALID_ARGUMENT: line\\nbreak \\x1b[2J \\u009b2J \\u202e"),
            std::string::npos)
      << table;
  EXPECT_NE(lines[2].find("DOWN"), std::string::npos) << table;
  EXPECT_NE(lines[2].find("UNAVAILABLE: failed to connect to all addresses"), std::string::npos);
  // Every column starts at the same offset in every line: the state column shows it.
  const size_t state = lines[0].find("state");
  EXPECT_EQ(lines[1].find("up"), state) << table;
  EXPECT_EQ(lines[2].find("DOWN"), state) << table;
  // Right-aligned numbers end at the header's end.
  const size_t steps_end = lines[0].find("steps") + 5;
  EXPECT_EQ(lines[1].substr(steps_end - 6, 6), "123456") << table;

  EXPECT_EQ(FormatStatusJson(status).find("\n"), FormatStatusJson(status).size() - 1);
  EXPECT_NE(FormatStatusJson(status).find("\"ratio\":4.0000"), std::string::npos);
  EXPECT_NE(FormatStatusJson(status).find(
                "\"last_error\":\"INVALID_ARGUMENT: line\\nbreak \\u001b[2J \\u009b2J \\u202e\""),
            std::string::npos)
      << FormatStatusJson(status);
}

}  // namespace
}  // namespace gcomp::admin
