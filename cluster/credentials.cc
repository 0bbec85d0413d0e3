#include "cluster/credentials.h"

#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "base/files.h"
#include "base/logging.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/client_interceptor.h"

namespace gcomp::cluster {
namespace {

constexpr char kAuthorization[] = "authorization";

bool TlsOn(const proto::SecurityConfig& sec) { return !sec.ca_file().empty(); }

// gRPC's file watcher only logs unreadable files and then fails every handshake; check
// them once up front so that a wrong path is a clear error at startup.
absl::Status CheckPemFile(absl::string_view field, const std::string& path) {
  // PEM bundles are kilobytes; a path pointed at a device must not be read for good.
  constexpr uint64_t kMaxPemBytes = 16 << 20;
  absl::StatusOr<std::string> bytes = ReadFile(path, kMaxPemBytes);
  if (absl::IsFailedPrecondition(bytes.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("security.", field, " '", path, "': ", bytes.status().message()));
  }
  if (!bytes.ok()) {
    return absl::NotFoundError(absl::StrCat("security.", field, " '", path, "': cannot be read"));
  }
  if (!absl::StrContains(*bytes, "-----BEGIN ")) {
    return absl::FailedPreconditionError(
        absl::StrCat("security.", field, " '", path, "': holds no PEM block"));
  }
  return absl::OkStatus();
}

absl::Status CheckTlsFiles(const proto::SecurityConfig& sec) {
  absl::Status s = CheckPemFile("ca_file", sec.ca_file());
  if (s.ok()) s = CheckPemFile("cert_file", sec.cert_file());
  if (s.ok()) s = CheckPemFile("key_file", sec.key_file());
  return s;
}

// The identity (cert_file + key_file) and the roots (ca_file), re-read every refresh.
std::shared_ptr<grpc::experimental::CertificateProviderInterface> FileProvider(
    const proto::SecurityConfig& sec) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      sec.key_file(), sec.cert_file(), sec.ca_file(), sec.cert_refresh_s());
}

absl::StatusOr<std::shared_ptr<JobToken>> LoadToken(const proto::SecurityConfig& sec) {
  if (sec.token_file().empty()) return std::shared_ptr<JobToken>();
  return JobToken::Load(sec.token_file(), absl::Seconds(sec.cert_refresh_s()));
}

// Adds the token to every call's initial metadata. Channel-level (rather than call
// credentials) so it works the same over TLS and plaintext: gRPC sends call credentials
// only over channels with privacy.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace(kAuthorization, header_);
    }
    methods->Proceed();
  }

 private:
  const std::string header_;
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(std::shared_ptr<JobToken> token) : token_(std::move(token)) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(token_->Header());
  }

 private:
  const std::shared_ptr<JobToken> token_;
};

}  // namespace

absl::StatusOr<ServerSecurity> MakeServerSecurity(const proto::ClusterConfig& config) {
  const proto::SecurityConfig& sec = config.security();
  ServerSecurity out;
  absl::StatusOr<std::shared_ptr<JobToken>> token = LoadToken(sec);
  if (!token.ok()) return token.status();
  out.token = *std::move(token);
  if (!TlsOn(sec)) {
    out.credentials = grpc::InsecureServerCredentials();
    return out;
  }
  absl::Status files = CheckTlsFiles(sec);
  if (!files.ok()) return files;
  grpc::experimental::TlsServerCredentialsOptions options(FileProvider(sec));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  out.credentials = grpc::experimental::TlsServerCredentials(options);
  out.tls = true;
  return out;
}

absl::StatusOr<ClientSecurity> MakeClientSecurity(const proto::ClusterConfig& config) {
  const proto::SecurityConfig& sec = config.security();
  ClientSecurity out;
  absl::StatusOr<std::shared_ptr<JobToken>> token = LoadToken(sec);
  if (!token.ok()) return token.status();
  out.token = *std::move(token);
  if (!TlsOn(sec)) {
    out.credentials = grpc::InsecureChannelCredentials();
    return out;
  }
  absl::Status files = CheckTlsFiles(sec);
  if (!files.ok()) return files;
  // Server certificates are verified against ca_file, and the dialled host against their
  // subjectAltName (gRPC's default verifier checks the host name).
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(FileProvider(sec));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  out.credentials = grpc::experimental::TlsCredentials(options);
  if (out.credentials == nullptr) {
    return absl::InternalError("gRPC refused the TLS channel credentials options");
  }
  out.tls = true;
  return out;
}

std::shared_ptr<grpc::Channel> ClientSecurity::NewChannel(
    const std::string& target, const grpc::ChannelArguments& given) const {
  // Compressed responses are refused on their headers, as the shards refuse compressed
  // requests: gRPC would inflate a message before checking its size.
  grpc::ChannelArguments args = given;
  args.SetInt(GRPC_COMPRESSION_CHANNEL_ENABLED_ALGORITHMS_BITSET, 1 << GRPC_COMPRESS_NONE);
  args.SetInt(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
  if (token == nullptr) return grpc::CreateCustomChannel(target, credentials, args);
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<TokenInterceptorFactory>(token));
  return grpc::experimental::CreateCustomChannelWithInterceptors(target, credentials, args,
                                                                 std::move(interceptors));
}

std::string DescribeSecurity(const proto::ClusterConfig& config) {
  const proto::SecurityConfig& sec = config.security();
  std::string out;
  if (TlsOn(sec)) {
    absl::StrAppend(&out, "mutual TLS (ca ", sec.ca_file(), ", cert ", sec.cert_file(),
                    ", files re-read every ", sec.cert_refresh_s(), " s)");
  } else {
    absl::StrAppend(&out, "INSECURE: plaintext, no certificates");
  }
  if (sec.token_file().empty()) {
    absl::StrAppend(&out, ", no job token: any client that reaches the port is served");
  } else {
    absl::StrAppend(&out, ", job token from ", sec.token_file(),
                    TlsOn(sec) ? "" : " (sent in the clear)");
  }
  if (sec.health_port() != 0) {
    absl::StrAppend(&out, ", plaintext health on port ", sec.health_port());
  }
  return out;
}

absl::Status AuthorizeCall(JobToken* token, const grpc::ServerContextBase& context,
                           absl::string_view method) {
  if (token == nullptr) return absl::OkStatus();
  std::vector<absl::string_view> values;
  const auto range = context.client_metadata().equal_range(kAuthorization);
  for (auto it = range.first; it != range.second; ++it) {
    values.emplace_back(it->second.data(), it->second.size());
  }
  absl::Status s = token->Check(values);
  if (!s.ok()) {
    // Logged, but a client hammering a shard with bad tokens must not flood the log.
    static log::LineBudget* const refusals = new log::LineBudget(10, "refused calls");
    if (refusals->Admit()) {
      log::Warn("refused {} from {}: {}", std::string(method), context.peer(),
                std::string(s.message()));
    }
  }
  return s;
}

}  // namespace gcomp::cluster
