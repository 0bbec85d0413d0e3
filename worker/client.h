// The worker-side client of the parameter server: connects to every shard of a cluster
// config, declares tensors, and push-pulls one tensor for one step.
//
//   auto client = Client::Connect(config, {.worker = 0});
//   (*client)->Declare("grad", codec::DType::kF32, n);
//   std::future<absl::Status> done = (*client)->PushPullAsync("grad", step, in, out);
//   ... overlap other work ...
//   absl::Status s = done.get();   // out holds the aggregated result of `step`
//
// Inside: the tensor is cut into chunks (ChunkLayout), each owned by one shard
// (ShardMap, checked against the shard's epoch on every call); each chunk is encoded with
// the uplink codec while earlier chunks are in flight (up to max_inflight_chunks at once,
// spread over channels_per_shard channels per shard); UNAVAILABLE (shard unreachable)
// and CANCELLED (a draining shard dropped the call) are retried up to max_retries times
// with exponential backoff from retry_backoff_ms, at most 5 s apart (safe: pushes are
// idempotent on the shard); every call has the config's rpc_timeout_ms deadline. A call
// a shard answers ABORTED (a live re-shard replaced the map) fetches the new map from that
// shard, registers and declares every tensor there, and is resent under it. With config
// `replicas` >= 2, a shard still UNAVAILABLE after the retries is reported down to another
// shard, which fails it over; the call is then resent to the chunk's backup under the new
// map.
//
// Thread-safe: operations on different tensors (or different steps) may run concurrently.
// Errors keep the shard's status code and name the tensor, chunk, step and shard.
#ifndef GCOMP_WORKER_CLIENT_H_
#define GCOMP_WORKER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "codec/codec.h"
#include "proto/cluster_config.pb.h"

namespace gcomp::worker {

struct ClientOptions {
  // This worker's id in [0, config.workers).
  uint32_t worker = 0;
  // How errors on the shards name this worker; default "worker-<id>".
  std::string name;
  // Serve this worker's Prometheus metrics on http://ADDRESS/metrics ("host:port"; port 0
  // picks a free one, see Client::metrics_port()). Empty: no metrics endpoint.
  std::string metrics_address;
  // Tells this worker process from another started with the same index: shards refuse
  // the pushes of a process once another has registered as its worker (ALREADY_EXISTS).
  // 0 (the default): one random id per process, shared by its clients.
  uint64_t session = 0;
};

// Byte counters since Connect. raw_* count the tensor bytes a call carried (as if sent
// uncompressed), wire_* the encoded block bytes actually sent and received.
struct ClientStats {
  uint64_t raw_bytes_sent = 0;
  uint64_t raw_bytes_received = 0;
  uint64_t wire_bytes_sent = 0;
  uint64_t wire_bytes_received = 0;
  uint64_t chunks = 0;
  uint64_t retries = 0;
  // Moves to a new shard map after a live re-shard (docs/SERVICE.md, "Re-sharding").
  uint64_t map_switches = 0;
  // Reports of an unreachable shard this client sent (replicas >= 2: it is failed over):
  // one per call that found it unreachable, so usually several for one shard.
  uint64_t down_reports = 0;
};

class Client {
 public:
  // Connects to every shard and registers this worker, waiting up to the config's
  // connect_timeout_ms for shards to come up. The config must be valid.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const proto::ClusterConfig& config,
                                                         const ClientOptions& options);
  // Callers end their calls (and wait for the futures of PushPullAsync) before destroying
  // the Client; the Python binding waits for them in close().
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Declares `key` on every shard (idempotent; every worker may call it). `initial`
  // (elements of dtype, may be null for zeros) is the starting parameter value used by
  // sgd/momentum/adam.
  absl::Status Declare(const std::string& key, codec::DType dtype, size_t elements,
                       const void* initial = nullptr);

  // Pushes `input` as this worker's contribution to `step` of `key` and writes the
  // aggregated result (mean gradient, or parameters under an optimizer) into `output`.
  // Both hold the declared element count and dtype, are borrowed until the future is
  // ready, and may be the same buffer.
  std::future<absl::Status> PushPullAsync(const std::string& key, int64_t step,
                                          const void* input, void* output);
  absl::Status PushPull(const std::string& key, int64_t step, const void* input, void* output);

  // Writes the current value of `key` (last result or parameters) into `output`.
  absl::Status Pull(const std::string& key, void* output);

  // The step to push next for `key`: one more than the oldest last-completed step among
  // its chunks, so 0 for a fresh tensor and s + 1 after shards restored a checkpoint of
  // step s (docs/CHECKPOINT.md). Chunks already past it answer a resent step with their
  // cached result, so every worker may resume from here. Declare the tensor first.
  absl::StatusOr<int64_t> ResumeStep(const std::string& key);

  ClientStats stats() const;
  // The port /metrics is served on; 0 without ClientOptions::metrics_address.
  int metrics_port() const;
  // The config given to Connect (a re-shard changes the map inside; see stats()).
  const proto::ClusterConfig& config() const;
  uint32_t worker() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gcomp::worker

#endif  // GCOMP_WORKER_CLIENT_H_
