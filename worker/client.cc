#include "worker/client.h"

#include <algorithm>
#include <future>
#include <limits>
#include <optional>
#include <random>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "gpu/runtime.h"
#include "worker/bounded_queue.h"
#include "worker/client_impl.h"
#include "worker/device_chunks.h"

namespace gcomp::worker {
namespace {

// One random, nonzero id per process: every Client of the process shares it, and a restarted
// process gets a new one (ClientOptions::session).
uint64_t ProcessSession() {
  static const uint64_t session = [] {
    std::random_device random;
    const uint64_t id = (uint64_t{random()} << 32) ^ random();
    return id == 0 ? 1 : id;
  }();
  return session;
}

}  // namespace

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const proto::ClusterConfig& config,
                                                        const ClientOptions& options) {
  absl::Status valid = cluster::ValidateClusterConfig(config);
  if (!valid.ok()) return valid;
  if (options.worker >= config.workers()) {
    return absl::InvalidArgumentError(absl::StrCat("worker ", options.worker,
                                                   " out of range: the job has ",
                                                   config.workers(), " workers"));
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  if (impl->config.max_message_bytes() == 0) {
    impl->config.set_max_message_bytes(2 * config.chunk_bytes() + (1 << 20));
  }
  impl->options = options;
  if (impl->options.name.empty()) impl->options.name = absl::StrCat("worker-", options.worker);
  if (impl->options.session == 0) impl->options.session = ProcessSession();
  impl->uplink = cluster::UplinkCodec(config);
  // TLS or plaintext and the job token, as the config's `security` says.
  absl::StatusOr<cluster::ClientSecurity> security = cluster::MakeClientSecurity(config);
  if (!security.ok()) return security.status();
  impl->security = std::make_unique<cluster::ClientSecurity>(*std::move(security));
  if (!options.metrics_address.empty()) {
    Impl* raw = impl.get();
    impl->metrics = std::make_shared<ClientMetrics>(config.job(), options.worker,
                                                    [raw] { return raw->Stats(); });
    absl::StatusOr<std::unique_ptr<MetricsExposer>> exposer =
        MetricsExposer::Start(options.metrics_address, impl->metrics);
    if (!exposer.ok()) return exposer.status();
    impl->metrics_exposer = *std::move(exposer);
  }
  std::shared_ptr<MapState> m = impl->BuildMap(impl->config);
  {
    absl::MutexLock lock(&impl->map_mu);
    impl->map = m;
  }
  uint32_t unreachable = cluster::ShardMap::kNone;
  absl::Status s = impl->RegisterAll(*m, impl->config.connect_timeout_ms(), true, &unreachable);
  // A config from before a re-shard or failover (a worker restarted with the job's original
  // file): the shards name the newer map; take it from them, as a running client does.
  if (absl::IsAborted(s)) s = impl->SwitchMap(*m, 0);
  if (!s.ok() && m->replicas > 1 && unreachable != cluster::ShardMap::kNone) {
    // A shard of the config is down (a worker started while one is failed over): the
    // running shards serve, or soon commit, the map without it.
    impl->ReportDown(*m, unreachable, std::string(s.message()));
    absl::Status switched = impl->SwitchMap(*m, (unreachable + 1) % m->config.shards_size(),
                                            absl::Milliseconds(impl->config.rpc_timeout_ms()));
    if (switched.ok()) {
      s = switched;
    } else {
      s = absl::Status(s.code(), absl::StrCat(s.message(), "; and no running shard serves a map "
                                              "without it: ", switched.message()));
    }
  }
  if (!s.ok()) return s;
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

absl::Status Client::Declare(const std::string& key, codec::DType dtype, size_t elements,
                             const void* initial) {
  Impl& m = *impl_;
  if (absl::Status s = cluster::CheckTensorElements(key, elements); !s.ok()) return s;
  TensorInfo t;
  t.dtype = dtype;
  t.layout = cluster::ChunkLayout(elements, codec::DTypeBytes(dtype), m.config.chunk_bytes());
  if (absl::Status s = m.DeclareOn(*m.Map(), key, t, elements, initial); !s.ok()) return s;
  absl::MutexLock lock(&m.mu);
  m.tensors[key] = std::move(t);
  return absl::OkStatus();
}

absl::Status Client::Impl::RunPushPull(const std::string& key, int64_t step, const void* input,
                                       void* output) {
  absl::StatusOr<TensorInfo> found = Find(key);
  if (!found.ok()) return found.status();
  const TensorInfo& t = *found;
  const size_t esize = codec::DTypeBytes(t.dtype);
  const size_t num_chunks = t.layout.num_chunks;
  // The map and owners the chunks go to; replaced (under map_mu) if a re-shard moves the
  // job while this call runs.
  absl::Mutex owners_mu;
  std::shared_ptr<const MapState> map_now = Map();
  std::vector<uint32_t> owners = map_now->Owners(key, t);
  auto current = [&](uint32_t chunk) {
    absl::MutexLock lock(&owners_mu);
    std::shared_ptr<const MapState> latest = Map();
    if (latest != map_now) {
      map_now = latest;
      owners = latest->Owners(key, t);
    }
    return std::make_pair(map_now, owners[chunk]);
  };
  const size_t senders = std::min<size_t>(config.max_inflight_chunks(), num_chunks);
  cluster::DirectionCodec up = uplink;
  up.checksum = push_checksum.load();

  // Device tensors: every chunk is encoded up front in one GPU batch, and the replies are
  // kept (checked) to be decoded in one GPU batch at the end.
  const bool on_device = gpu::IsDevicePointer(input);
  if (on_device != gpu::IsDevicePointer(output)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "push-pull of '", key, "': input and output must both be host or both be CUDA memory"));
  }
  std::vector<std::string> device_encoded;
  std::vector<proto::CompressedBlock> device_replies;
  if (on_device) {
    absl::StatusOr<std::vector<std::string>> enc =
        EncodeDeviceChunks(uplink, t.dtype, input, t.layout);
    if (!enc.ok()) return enc.status();
    device_encoded = *std::move(enc);
    device_replies.resize(num_chunks);
  }

  // Encoded chunks wait here for a sender, at most `senders` of them.
  BoundedQueue<std::unique_ptr<cluster::WireMessage>> queue(senders);
  auto fail = [&](absl::Status s) { queue.Fail(std::move(s)); };

  auto send = [&] {
    std::string scratch;  // a GComp reply that arrived in pieces, joined
    while (std::optional<std::unique_ptr<cluster::WireMessage>> next = queue.Pop()) {
      std::unique_ptr<cluster::WireMessage> req = *std::move(next);
      const uint32_t chunk = req->header().address().chunk();
      cluster::WireMessage resp;
      grpc::Status st;
      std::shared_ptr<const MapState> m;
      uint32_t shard = 0;
      for (int switches = 0;; ++switches) {
        std::tie(m, shard) = current(chunk);
        if (shard == cluster::ShardMap::kNone) {
          fail(m->NoOwner(key, t, chunk));
          return;
        }
        req->mutable_header()->mutable_address()->set_shard_map_epoch(m->epoch());
        st = CallShard(*m, shard, [&](const MapState::Stubs* stub, grpc::ClientContext* ctx) {
          return stub->push_pull->PushPull(ctx, *req, &resp);
        });
        // A re-shard replaced the map: move to the new one and resend (pushes are
        // idempotent, and the chunk's state, cached result included, moved with it).
        absl::Status error;
        if (st.ok() || switches >= kMaxMapSwitches) break;
        if (ResendAfterSwitch(st, *m, shard, &error)) continue;
        if (!error.ok()) {
          fail(error);
          return;
        }
        break;
      }
      const std::string where = absl::StrCat("push-pull of '", key, "' chunk ", chunk, " step ",
                                             step, " on shard ", shard, " (",
                                             m->config.shards(shard), ")");
      if (!st.ok()) {
        fail(FromGrpc(st, where));
        return;
      }
      const proto::BlockAddress& got = resp.header().address();
      if (got.key() != key || got.chunk() != chunk || got.step() != step) {
        fail(absl::InternalError(absl::StrCat(where, ": reply addressed to '", got.key(),
                                              "' chunk ", got.chunk(), " step ", got.step())));
        return;
      }
      const size_t n = t.layout.size(chunk);
      absl::Status d =
          on_device ? cluster::CheckWireBlock(resp.header(), resp.data(), t.dtype, n, &scratch)
                    : cluster::DecodeWireBlock(
                          resp.header(), resp.data(), t.dtype, n,
                          static_cast<char*>(output) + t.layout.begin(chunk) * esize, &scratch);
      if (!d.ok()) {
        fail(absl::Status(d.code(), absl::StrCat(where, ": reply: ", d.message())));
        return;
      }
      raw_received += n * esize;
      wire_received += resp.data_size();
      ++chunks;
      if (on_device) device_replies[chunk] = resp.ToBlock();  // each chunk has one sender
    }
  };

  absl::BlockingCounter sent(static_cast<int>(senders));
  for (size_t i = 0; i < senders; ++i) {
    threads.Run(send, [&] { sent.DecrementCount(); });
  }
  for (uint32_t c = 0; c < num_chunks && !queue.failed(); ++c) {
    proto::CompressedBlock block;
    const size_t n = t.layout.size(c);
    absl::Status s =
        on_device
            ? cluster::FillWireBlock(up, t.dtype, n, std::move(device_encoded[c]), &block)
            : cluster::EncodeWireBlock(up, t.dtype,
                                       static_cast<const char*>(input) + t.layout.begin(c) * esize,
                                       n, &block);
    if (!s.ok()) {
      fail(s);
      break;
    }
    proto::BlockAddress* a = block.mutable_address();
    a->set_job(config.job());
    a->set_key(key);
    a->set_chunk(c);
    a->set_step(step);
    a->set_worker(options.worker);
    a->set_session(options.session);
    raw_sent += n * esize;
    wire_sent += block.data().size();
    // The encoded payload moves into the message and is sent from where it lies.
    auto req = std::make_unique<cluster::WireMessage>(cluster::WireMessage::Own(std::move(block)));
    if (!queue.Push(std::move(req))) break;
  }
  queue.Close();
  sent.Wait();
  if (absl::Status s = queue.status(); !s.ok()) return s;
  if (on_device) return DecodeDeviceChunks(t.dtype, device_replies, t.layout, output);
  return absl::OkStatus();
}

std::future<absl::Status> Client::PushPullAsync(const std::string& key, int64_t step,
                                                const void* input, void* output) {
  struct Call {
    std::promise<absl::Status> done;
    absl::Status status;
  };
  auto call = std::make_shared<Call>();
  std::future<absl::Status> result = call->done.get_future();
  // The future is set once the thread is free again (ThreadCache::Run's `then`), so a
  // caller that waits for it and pushes the next step reuses the thread.
  impl_->threads.Run(
      [this, call, key, step, input, output] { call->status = PushPull(key, step, input, output); },
      [call] { call->done.set_value(std::move(call->status)); });
  return result;
}

absl::Status Client::PushPull(const std::string& key, int64_t step, const void* input,
                              void* output) {
  const absl::Time start = absl::Now();
  absl::Status s = impl_->RunPushPull(key, step, input, output);
  if (impl_->metrics != nullptr) impl_->metrics->ObservePushPull(absl::ToDoubleSeconds(absl::Now() - start));
  return s;
}

int Client::metrics_port() const {
  return impl_->metrics_exposer == nullptr ? 0 : impl_->metrics_exposer->port();
}

absl::Status Client::Pull(const std::string& key, void* output) {
  Impl& m = *impl_;
  absl::StatusOr<TensorInfo> found = m.Find(key);
  if (!found.ok()) return found.status();
  const TensorInfo& t = *found;
  const size_t esize = codec::DTypeBytes(t.dtype);
  const bool on_device = gpu::IsDevicePointer(output);
  std::vector<proto::CompressedBlock> device_replies(on_device ? t.layout.num_chunks : 0);
  for (uint32_t c = 0; c < t.layout.num_chunks; ++c) {
    absl::StatusOr<proto::CompressedBlock> pulled = m.PullChunk(key, t, c);
    if (!pulled.ok()) return pulled.status();
    proto::CompressedBlock& resp = *pulled;
    if (on_device) {
      if (absl::Status d = cluster::CheckWireBlock(resp, t.dtype, t.layout.size(c)); !d.ok()) {
        return d;
      }
      device_replies[c] = std::move(resp);
      continue;
    }
    absl::Status d = cluster::DecodeWireBlock(
        resp, t.dtype, t.layout.size(c), static_cast<char*>(output) + t.layout.begin(c) * esize);
    if (!d.ok()) return d;
  }
  if (on_device) return DecodeDeviceChunks(t.dtype, device_replies, t.layout, output);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Client::ResumeStep(const std::string& key) {
  Impl& m = *impl_;
  absl::StatusOr<TensorInfo> found = m.Find(key);
  if (!found.ok()) return found.status();
  const TensorInfo& t = *found;
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (uint32_t c = 0; c < t.layout.num_chunks; ++c) {
    absl::StatusOr<proto::CompressedBlock> pulled = m.PullChunk(key, t, c);
    if (!pulled.ok()) return pulled.status();
    proto::CompressedBlock& resp = *pulled;
    // A chunk's value carries its last completed step (-1: none yet).
    oldest = std::min(oldest, resp.address().step());
  }
  return oldest + 1;
}

ClientStats Client::stats() const { return impl_->Stats(); }

const proto::ClusterConfig& Client::config() const { return impl_->config; }
uint32_t Client::worker() const { return impl_->options.worker; }

}  // namespace gcomp::worker
