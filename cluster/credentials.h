// gRPC credentials from a validated config's `security` section (docs/SERVICE.md,
// "Security"), shared by shards, workers and (later) shard-to-shard channels.
//
//   Shard:  absl::StatusOr<ServerSecurity> sec = MakeServerSecurity(config);
//           builder.AddListeningPort(address, sec->credentials, &port);
//           ...in every non-health RPC: AuthorizeCall(sec->token.get(), *context, "X.Y")
//   Client: absl::StatusOr<ClientSecurity> sec = MakeClientSecurity(config);
//           std::shared_ptr<grpc::Channel> ch = sec->NewChannel("host:port", args);
//
// With ca_file/cert_file/key_file set, both ends speak mutual TLS: the shard requires a
// client certificate and verifies it against ca_file; the client presents cert_file and
// verifies the shard's certificate against ca_file and the host it dialled (the host part
// of the shard's host:port must be in the certificate's subjectAltName). The files are
// re-read every cert_refresh_s seconds, so a renewed certificate is used for new
// connections without a restart. Without them everything is plaintext ("insecure").
//
// With token_file set, every call carries "authorization: Bearer <token>" and shards check
// it, with or without TLS (without TLS the token crosses the network in the clear, which
// only suits a trusted network such as loopback).
//
// Errors name the config field and path: NotFound for a file that cannot be read,
// FailedPrecondition for one that holds no PEM block or no token.
#ifndef GCOMP_CLUSTER_CREDENTIALS_H_
#define GCOMP_CLUSTER_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cluster/job_token.h"
#include "grpcpp/grpcpp.h"
#include "proto/cluster_config.pb.h"

namespace gcomp::cluster {

// What a shard listens with. Copyable; the members are shared.
struct ServerSecurity {
  bool tls = false;
  // Mutual TLS (client certificate required and verified) or insecure.
  std::shared_ptr<grpc::ServerCredentials> credentials;
  // Null when the config names no token_file: calls are not checked.
  std::shared_ptr<JobToken> token;
};

// What a worker (or a shard calling another shard) dials with. Copyable; the members are
// shared, so every channel made from copies re-reads the same files.
struct ClientSecurity {
  bool tls = false;
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::shared_ptr<JobToken> token;  // null: calls carry no token

  // A channel to `target` ("host:port") whose every call carries the token.
  std::shared_ptr<grpc::Channel> NewChannel(const std::string& target,
                                            const grpc::ChannelArguments& args = {}) const;
};

// Both require a config that passed ValidateClusterConfig, and check that the files exist
// and hold PEM blocks (gRPC itself would only log and fail every handshake).
absl::StatusOr<ServerSecurity> MakeServerSecurity(const proto::ClusterConfig& config);
absl::StatusOr<ClientSecurity> MakeClientSecurity(const proto::ClusterConfig& config);

// One line for a server's first log line, e.g. "INSECURE: plaintext, no client
// certificates, no job token" or "mutual TLS (ca ..., refreshed every 60 s), job token
// from ...". Never contains the token.
std::string DescribeSecurity(const proto::ClusterConfig& config);

// Checks one incoming call's token (OK when `token` is null) and logs a refusal with the
// peer address and `method`, never the token. Statuses as JobToken::Check.
absl::Status AuthorizeCall(JobToken* token, const grpc::ServerContextBase& context,
                           absl::string_view method);

}  // namespace gcomp::cluster

#endif  // GCOMP_CLUSTER_CREDENTIALS_H_
