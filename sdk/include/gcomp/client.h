// gcomp-ps worker client for C++ programs built outside this repository (CMake, Make,
// plain g++): push-pull of gradient tensors to the shards of a gcomp-ps cluster.
//
//   g++ -std=c++17 train.cc $(pkg-config --cflags --libs gcomp-client)
//
// The ABI surface is this header only: standard C++17 types (libstdc++'s C++11 string
// ABI) and the names in gcomp::sdk, exported from libgcomp_client.so.0 (soname); nothing of
// gRPC, protobuf or Abseil appears here, so a program needs none of their headers. A
// change that breaks this surface raises kAbiVersion and the soname's number. Install
// tree: tools/install_sdk.sh PREFIX (docs/SDK.md).
#ifndef GCOMP_SDK_CLIENT_H_
#define GCOMP_SDK_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gcomp::sdk {

inline constexpr int kAbiVersion = 0;
// The kAbiVersion the library was built with: a program checks it equals its own.
int LibraryAbiVersion();

// Element types of tensors (the codec compresses each in its own format).
enum class DType : int { kF32 = 0, kBF16 = 1, kF16 = 2 };

// The outcome of a call. `code` is the gRPC/Abseil status code number (0 OK, 3
// INVALID_ARGUMENT, 4 DEADLINE_EXCEEDED, 5 NOT_FOUND, 8 RESOURCE_EXHAUSTED, 14 UNAVAILABLE,
// ...); `message` says what went wrong, naming the shard, key or field.
struct Status {
  int code = 0;
  std::string message;
  bool ok() const { return code == 0; }
};

// Byte counters since Connect (see docs/SERVICE.md): raw_* as if sent uncompressed,
// wire_* what was sent and received.
struct Stats {
  uint64_t raw_bytes_sent = 0;
  uint64_t raw_bytes_received = 0;
  uint64_t wire_bytes_sent = 0;
  uint64_t wire_bytes_received = 0;
};

// One worker's connection to every shard. Thread-safe; several keys may be in flight.
class Client {
 public:
  // Loads the cluster config (YAML or JSON, the file every shard reads), applies
  // "field=value" overrides, connects to every shard and registers worker `worker`
  // (0 <= worker < the config's workers). Null with *status set on failure.
  static std::unique_ptr<Client> Connect(const std::string& config_path, uint32_t worker,
                                         const std::vector<std::string>& overrides,
                                         Status* status);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Declares `key` (elements of dtype) on the shards; every worker declares the same keys.
  Status Declare(const std::string& key, DType dtype, size_t elements);
  // Pushes this worker's `input` for `step` of `key` and writes the aggregated result (the
  // mean over workers, or parameters under a shard optimizer) into `output`; both hold the
  // declared elements and may be the same buffer. Blocks until every worker pushed.
  Status PushPull(const std::string& key, int64_t step, const void* input, void* output);
  // Writes the last result of `key` into `output`.
  Status Pull(const std::string& key, void* output);
  // The step to push next for `key` (0 when fresh; after a restart from a checkpoint, one
  // past the checkpoint's step).
  Status ResumeStep(const std::string& key, int64_t* step);
  Stats stats() const;

 private:
  struct Impl;
  explicit Client(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace gcomp::sdk

#endif  // GCOMP_SDK_CLIENT_H_
