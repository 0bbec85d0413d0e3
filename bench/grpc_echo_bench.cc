// Plain gRPC moving chunks of given sizes to a server process and back, the way one worker
// and one shard move a tensor: each "step" sends every chunk as a unary call (a `bytes`
// field of the chunk's size), at most --inflight calls at once over --channels channels,
// and the server answers with a message of the same size. The baseline the service's step
// is compared with (bench/service_overhead.sh, docs/BENCHMARKS.md "Service overhead").
//
//   grpc_echo_bench --chunk_bytes=1048576,1048576,524288 --steps 30
//
// Prints one JSON line: {"chunks":..,"bytes_per_step":..,"step_ms_p50":..,"step_ms_min":..}.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/malloc_tuning.h"
#include "bench/echo.grpc.pb.h"
#include "grpcpp/grpcpp.h"

ABSL_FLAG(std::vector<std::string>, chunk_bytes, {"1048576"},
          "Size of each chunk of a step, comma-separated (one call each).");
ABSL_FLAG(int, repeat, 1, "The chunk list repeated this many times per step.");
ABSL_FLAG(int, steps, 30, "Steps to time (after 3 untimed).");
ABSL_FLAG(int, inflight, 8, "Calls in flight at once (the client's max_inflight_chunks).");
ABSL_FLAG(int, channels, 2, "Channels to the server (the client's channels_per_shard).");

namespace {

class EchoService final : public gcomp::bench::Echo::Service {
  grpc::Status Echo(grpc::ServerContext*, const gcomp::bench::EchoMessage* request,
                    gcomp::bench::EchoMessage* response) override {
    // A reply of the same size, written (as the shard writes its encoded result).
    response->mutable_data()->resize(request->data().size());
    return grpc::Status::OK;
  }
};

// Runs the server in a child process; returns its port (read from a pipe) and pid.
std::pair<int, pid_t> StartServer() {
  int fds[2];
  if (pipe(fds) != 0) return {-1, -1};
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    EchoService service;
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.SetMaxReceiveMessageSize(1 << 30);
    builder.SetMaxSendMessageSize(1 << 30);
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (write(fds[1], &port, sizeof(port)) != sizeof(port)) _exit(1);
    close(fds[1]);
    server->Wait();
    _exit(0);
  }
  close(fds[1]);
  int port = -1;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port)) port = -1;
  close(fds[0]);
  return {port, pid};
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // The allocator settings gcomp_server and gcomp_worker run with (both processes inherit
  // them through the fork below), so the baseline pays what they pay per buffer.
  gcomp::TuneMallocForLargeBuffers();
  std::vector<size_t> sizes;
  for (const std::string& s : absl::GetFlag(FLAGS_chunk_bytes)) {
    size_t v = 0;
    if (!absl::SimpleAtoi(s, &v) || v == 0 || v > (size_t{1} << 29)) {
      fprintf(stderr, "grpc_echo_bench: --chunk_bytes: '%s' is not a size in [1, 2^29]\n",
              s.c_str());
      return 2;
    }
    sizes.push_back(v);
  }
  const int repeat = absl::GetFlag(FLAGS_repeat), steps = absl::GetFlag(FLAGS_steps);
  const int inflight = absl::GetFlag(FLAGS_inflight), nchan = absl::GetFlag(FLAGS_channels);
  if (repeat < 1 || steps < 1 || inflight < 1 || nchan < 1) {
    fprintf(stderr, "grpc_echo_bench: --repeat, --steps, --inflight, --channels must be >= 1\n");
    return 2;
  }
  std::vector<size_t> chunks;
  for (int r = 0; r < repeat; ++r) chunks.insert(chunks.end(), sizes.begin(), sizes.end());
  // Fork before this process starts any gRPC thread.
  const auto [port, server_pid] = StartServer();
  if (port <= 0) {
    fprintf(stderr, "grpc_echo_bench: the server did not start\n");
    return 1;
  }
  std::vector<std::unique_ptr<gcomp::bench::Echo::Stub>> stubs;
  for (int c = 0; c < nchan; ++c) {
    grpc::ChannelArguments args;
    args.SetInt("grpc.channel_id", c);  // distinct channels, not one shared subchannel
    args.SetMaxReceiveMessageSize(1 << 30);
    args.SetMaxSendMessageSize(1 << 30);
    stubs.push_back(gcomp::bench::Echo::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args)));
  }
  // The payloads, made once (the worker's encoded chunks exist before they are sent).
  std::vector<std::string> payloads;
  for (size_t n : chunks) payloads.push_back(std::string(n, '\x5a'));
  std::atomic<uint64_t> next_stub{0};
  std::vector<double> ms;
  bool ok = true;
  for (int step = 0; step < steps + 3 && ok; ++step) {
    const absl::Time start = absl::Now();
    std::atomic<size_t> next{0};
    std::atomic<bool> failed{false};
    std::vector<std::thread> senders;
    const int threads = std::min<int>(inflight, static_cast<int>(chunks.size()));
    for (int t = 0; t < threads; ++t) {
      senders.emplace_back([&] {
        for (size_t i; (i = next.fetch_add(1)) < chunks.size();) {
          gcomp::bench::EchoMessage req, resp;
          req.set_data(payloads[i]);
          grpc::ClientContext ctx;
          ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
          ctx.set_wait_for_ready(true);
          auto& stub = stubs[next_stub.fetch_add(1) % stubs.size()];
          grpc::Status s = stub->Echo(&ctx, req, &resp);
          if (!s.ok() || resp.data().size() != chunks[i]) failed = true;
        }
      });
    }
    for (std::thread& t : senders) t.join();
    if (failed) ok = false;
    if (step >= 3) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
  }
  kill(server_pid, SIGTERM);
  waitpid(server_pid, nullptr, 0);
  if (!ok) {
    fprintf(stderr, "grpc_echo_bench: a call failed\n");
    return 1;
  }
  std::sort(ms.begin(), ms.end());
  size_t bytes = 0;
  for (size_t n : chunks) bytes += n;
  printf("{\"chunks\":%zu,\"bytes_per_step\":%zu,\"inflight\":%d,\"channels\":%d,"
         "\"step_ms_p50\":%.3f,\"step_ms_min\":%.3f}\n",
         chunks.size(), bytes, inflight, nchan, ms[ms.size() / 2], ms.front());
  return 0;
}
