// Load generator for bench/worker_scaling.sh: W real client connections to one shard, one
// per worker id, pushing one tensor for a few steps; prints one JSON line with the call
// and step latencies and the shard's threads, RSS and descriptors (read from /proc while
// W - 1 pushes wait for the step's last one, when a thread-per-waiting-call server peaks).
//
//   worker_scaling_load ADDRESS SHARD_PID WORKERS ELEMENTS STEPS
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <dirent.h>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cluster/wire_block.h"
#include "grpcpp/grpcpp.h"
#include "proto/aggregation.grpc.pb.h"

namespace {

using gcomp::proto::Aggregation;
using gcomp::proto::CompressedBlock;

int64_t StatusField(int pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(field, 0) == 0) return std::atoll(line.c_str() + field.size());
  }
  return -1;
}

int Descriptors(int pid) {
  DIR* d = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (readdir(d) != nullptr) ++n;
  closedir(d);
  return n - 2;
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

struct Usage {
  int64_t threads, rss_kb;
  int fds;
};

Usage Sample(int pid) { return {StatusField(pid, "Threads:"), StatusField(pid, "VmRSS:"), Descriptors(pid)}; }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s ADDRESS SHARD_PID WORKERS ELEMENTS STEPS\n", argv[0]);
    return 2;
  }
  const std::string address = argv[1];
  const int pid = std::atoi(argv[2]);
  const uint32_t workers = static_cast<uint32_t>(std::atoi(argv[3]));
  const size_t elements = static_cast<size_t>(std::atoll(argv[4]));
  const int steps = std::atoi(argv[5]);
  const Usage idle = Sample(pid);

  std::vector<std::unique_ptr<Aggregation::Stub>> stubs;
  for (uint32_t w = 0; w < workers; ++w) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(64 << 20);
    args.SetMaxSendMessageSize(64 << 20);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetString("gcomp.bench.connection", absl::StrCat(w));  // one connection per worker
    auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(30))) {
      std::fprintf(stderr, "worker %u: no connection to %s\n", w, address.c_str());
      return 1;
    }
    stubs.push_back(Aggregation::NewStub(channel));
  }
  const Usage connected = Sample(pid);
  {
    gcomp::proto::DeclareTensorRequest d;
    d.set_job("bench");
    d.set_key("t");
    d.set_dtype(gcomp::proto::DTYPE_F32);
    d.set_elements(elements);
    d.set_shard_map_epoch(1);
    gcomp::proto::DeclareTensorResponse r;
    grpc::ClientContext c;
    if (grpc::Status s = stubs[0]->DeclareTensor(&c, d, &r); !s.ok()) {
      std::fprintf(stderr, "declare: %s\n", s.error_message().c_str());
      return 1;
    }
  }
  const std::vector<float> values(elements, 1.0f);
  CompressedBlock block;
  if (!gcomp::cluster::EncodeWireBlock({true, {}}, gcomp::codec::DType::kF32, values.data(),
                                       elements, &block).ok()) {
    return 1;
  }
  block.mutable_address()->set_job("bench");
  block.mutable_address()->set_key("t");
  block.mutable_address()->set_shard_map_epoch(1);

  std::vector<double> call_ms, step_ms;
  Usage peak = connected;
  int errors = 0;
  std::string first_error;
  // Step 0 pauses before its last push and samples the shard; the others run flat out.
  for (int step = 0; step < steps; ++step) {
    grpc::CompletionQueue cq;
    std::vector<std::unique_ptr<grpc::ClientContext>> contexts(workers);
    std::vector<CompressedBlock> outs(workers);
    std::vector<grpc::Status> statuses(workers);
    std::vector<absl::Time> started(workers);
    std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<CompressedBlock>>> calls(workers);
    const absl::Time step_start = absl::Now();
    for (uint32_t w = 0; w < workers; ++w) {
      if (step == 0 && w == workers - 1) {
        absl::SleepFor(absl::Milliseconds(500));
        const Usage u = Sample(pid);
        peak = {std::max(peak.threads, u.threads), std::max(peak.rss_kb, u.rss_kb),
                std::max(peak.fds, u.fds)};
      }
      block.mutable_address()->set_step(step);
      block.mutable_address()->set_worker(w);
      contexts[w] = std::make_unique<grpc::ClientContext>();
      contexts[w]->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
      started[w] = absl::Now();
      calls[w] = stubs[w]->AsyncPushPull(contexts[w].get(), block, &cq);  // serialized here
      calls[w]->Finish(&outs[w], &statuses[w], reinterpret_cast<void*>(uintptr_t{w}));
    }
    for (uint32_t n = 0; n < workers; ++n) {
      void* tag;
      bool ok;
      if (!cq.Next(&tag, &ok)) return 1;
      const uint32_t w = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(tag));
      if (step > 0) call_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - started[w]));
      if (!statuses[w].ok()) {
        if (errors++ == 0) first_error = statuses[w].error_message();
      }
    }
    step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - step_start));
    if (step > 0) {
      const Usage u = Sample(pid);
      peak = {std::max(peak.threads, u.threads), std::max(peak.rss_kb, u.rss_kb),
              std::max(peak.fds, u.fds)};
    }
  }
  step_ms.erase(step_ms.begin());  // the sampled step
  std::printf(
      "{\"workers\": %u, \"elements\": %zu, \"steps\": %d, \"errors\": %d, \"first_error\": \"%s\", "
      "\"step_ms_p50\": %.2f, \"step_ms_p99\": %.2f, \"call_ms_p50\": %.2f, \"call_ms_p99\": %.2f, "
      "\"threads_idle\": %lld, \"threads_peak\": %lld, \"rss_idle_kb\": %lld, "
      "\"rss_connected_kb\": %lld, \"rss_peak_kb\": %lld, \"fds_idle\": %d, \"fds_connected\": %d}\n",
      workers, elements, steps, errors, first_error.substr(0, 120).c_str(), Percentile(step_ms, 0.5),
      Percentile(step_ms, 0.99), Percentile(call_ms, 0.5), Percentile(call_ms, 0.99),
      static_cast<long long>(idle.threads), static_cast<long long>(peak.threads),
      static_cast<long long>(idle.rss_kb), static_cast<long long>(connected.rss_kb),
      static_cast<long long>(peak.rss_kb), idle.fds, connected.fds);
  return errors == 0 ? 0 : 1;
}
