// The SDK facade over worker::Client: converts std types to the internal ones and back.
#include "sdk/include/gcomp/client.h"

#include <utility>

#include "absl/status/status.h"
#include "cluster/cluster_config.h"
#include "worker/client.h"

namespace gcomp::sdk {
namespace {

Status FromAbsl(const absl::Status& s) {
  return Status{static_cast<int>(s.code()), std::string(s.message())};
}

absl::StatusOr<codec::DType> ToCodec(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return codec::DType::kF32;
    case DType::kBF16:
      return codec::DType::kBF16;
    case DType::kF16:
      return codec::DType::kF16;
  }
  return absl::InvalidArgumentError("unknown dtype " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

int LibraryAbiVersion() { return kAbiVersion; }

struct Client::Impl {
  std::unique_ptr<worker::Client> client;
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

std::unique_ptr<Client> Client::Connect(const std::string& config_path, uint32_t worker,
                                        const std::vector<std::string>& overrides,
                                        Status* status) {
  absl::StatusOr<proto::ClusterConfig> config = cluster::LoadClusterConfig(config_path, overrides);
  if (!config.ok()) {
    *status = FromAbsl(config.status());
    return nullptr;
  }
  worker::ClientOptions options;
  options.worker = worker;
  absl::StatusOr<std::unique_ptr<worker::Client>> client = worker::Client::Connect(*config, options);
  if (!client.ok()) {
    *status = FromAbsl(client.status());
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->client = *std::move(client);
  *status = Status{};
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Status Client::Declare(const std::string& key, DType dtype, size_t elements) {
  absl::StatusOr<codec::DType> d = ToCodec(dtype);
  if (!d.ok()) return FromAbsl(d.status());
  return FromAbsl(impl_->client->Declare(key, *d, elements));
}

Status Client::PushPull(const std::string& key, int64_t step, const void* input, void* output) {
  return FromAbsl(impl_->client->PushPull(key, step, input, output));
}

Status Client::Pull(const std::string& key, void* output) {
  return FromAbsl(impl_->client->Pull(key, output));
}

Status Client::ResumeStep(const std::string& key, int64_t* step) {
  absl::StatusOr<int64_t> s = impl_->client->ResumeStep(key);
  if (!s.ok()) return FromAbsl(s.status());
  *step = *s;
  return Status{};
}

Stats Client::stats() const {
  const worker::ClientStats s = impl_->client->stats();
  return Stats{s.raw_bytes_sent, s.raw_bytes_received, s.wire_bytes_sent, s.wire_bytes_received};
}

}  // namespace gcomp::sdk
