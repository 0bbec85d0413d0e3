// A worker built with plain g++ against the installed SDK (sdk/install_test.py builds and
// runs it): declares one tensor, pushes worker-specific values for a few steps and checks
// every result against the mean over all workers. Prints one JSON line.
//
//   push_pull CONFIG WORKER WORKERS ELEMENTS STEPS
#include <gcomp/client.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

// Worker w's element i at step s; the mean over workers is computed the same way.
float Value(int w, int s, size_t i) {
  return std::sin(0.001f * static_cast<float>(i) + static_cast<float>(s)) * (1.0f + w);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: push_pull CONFIG WORKER WORKERS ELEMENTS STEPS\n");
    return 2;
  }
  if (gcomp::sdk::LibraryAbiVersion() != gcomp::sdk::kAbiVersion) {
    std::fprintf(stderr, "libgcomp_client ABI %d, header %d\n", gcomp::sdk::LibraryAbiVersion(),
                 gcomp::sdk::kAbiVersion);
    return 1;
  }
  const int worker = std::atoi(argv[2]), workers = std::atoi(argv[3]);
  const size_t n = std::strtoul(argv[4], nullptr, 10);
  const int steps = std::atoi(argv[5]);
  gcomp::sdk::Status status;
  std::unique_ptr<gcomp::sdk::Client> client =
      gcomp::sdk::Client::Connect(argv[1], static_cast<uint32_t>(worker), {}, &status);
  if (client == nullptr) {
    std::fprintf(stderr, "connect: %s (code %d)\n", status.message.c_str(), status.code);
    return 1;
  }
  status = client->Declare("example/weights", gcomp::sdk::DType::kF32, n);
  if (!status.ok()) {
    std::fprintf(stderr, "declare: %s\n", status.message.c_str());
    return 1;
  }
  std::vector<float> mine(n), result(n);
  double max_rel_err = 0.0;
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < n; ++i) mine[i] = Value(worker, s, i);
    status = client->PushPull("example/weights", s, mine.data(), result.data());
    if (!status.ok()) {
      std::fprintf(stderr, "push_pull step %d: %s\n", s, status.message.c_str());
      return 1;
    }
    double max_abs = 0.0, max_err = 0.0;
    for (size_t i = 0; i < n; ++i) {
      double mean = 0.0;
      for (int w = 0; w < workers; ++w) mean += Value(w, s, i);
      mean /= workers;
      max_abs = std::max(max_abs, std::fabs(mean));
      max_err = std::max(max_err, std::fabs(result[i] - mean));
    }
    max_rel_err = std::max(max_rel_err, max_abs > 0 ? max_err / max_abs : max_err);
  }
  // Asking for an undeclared key must fail with a status, not crash.
  const gcomp::sdk::Status missing = client->Pull("example/undeclared", result.data());
  const gcomp::sdk::Stats stats = client->stats();
  std::printf("{\"worker\": %d, \"steps\": %d, \"max_rel_err\": %.3g, \"wire_bytes_sent\": %llu, "
              "\"raw_bytes_sent\": %llu, \"undeclared_code\": %d}\n",
              worker, steps, max_rel_err, static_cast<unsigned long long>(stats.wire_bytes_sent),
              static_cast<unsigned long long>(stats.raw_bytes_sent), missing.code);
  return 0;
}
