// Real gcomp_server processes for multi-process tests and the fault harness: start shard K
// of a config, stop it with a signal, start it again (empty, as a restarted pod), and the
// training run every worker of such a test makes (Clients in threads, lossless results
// compared bit for bit). Not thread-safe, except Train's workers.
#ifndef GCOMP_TESTS_SHARD_PROCESSES_H_
#define GCOMP_TESTS_SHARD_PROCESSES_H_

#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cluster/cluster_config.h"
#include "server/grpc_service.h"
#include "tests/synthetic_gradient.h"
#include "worker/client.h"

namespace gcomp::testing {

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline bool Listening(const std::string& address) {
  const size_t colon = address.rfind(':');
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  // An IPv4 host as given (a shard in its own network namespace has one); else loopback.
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &a.sin_addr) != 1) {
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  }
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(address.substr(colon + 1))));
  const bool ok = connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  close(fd);
  return ok;
}

class ShardProcesses {
 public:
  // `server`: the gcomp_server binary; logs and the config file go to `dir`.
  ShardProcesses(std::string server, std::string dir, proto::ClusterConfig config)
      : server_(std::move(server)), dir_(std::move(dir)), config_(std::move(config)),
        pids_(config_.shards_size(), -1) {
    config_path_ = absl::StrCat(dir_, "/cluster-", config_.job(), ".yaml");
    std::ofstream(config_path_) << cluster::ClusterConfigToYaml(config_);
  }
  ~ShardProcesses() {
    for (size_t k = 0; k < pids_.size(); ++k) Kill(static_cast<int>(k));
    for (pid_t pid : extra_) Reap(pid, SIGKILL);
  }

  const proto::ClusterConfig& config() const { return config_; }
  // Rewrites the file the shards read (started from now on, and watched by the running
  // ones) with `file`, e.g. an older map than config() (a ConfigMap left unedited).
  void WriteConfigFile(const proto::ClusterConfig& file) {
    std::ofstream(config_path_) << cluster::ClusterConfigToYaml(file);
  }
  pid_t pid(int k) const { return pids_[k]; }
  // Shard k's current log (one file per start).
  const std::string& log(int k) const { return logs_[k]; }

  // Starts shard k (again); its pid.
  pid_t Start(int k) {
    const std::string log = absl::StrCat(dir_, "/", config_.job(), "-shard", k, "-", ++starts_, ".log");
    if (logs_.size() < pids_.size()) logs_.resize(pids_.size());
    logs_[k] = log;
    const pid_t pid = Fork(k, log);
    pids_[k] = pid;
    return pid;
  }
  // A second process as shard k (a duplicate): its pid and log; reaped at the end.
  std::pair<pid_t, std::string> StartDuplicate(int k) {
    const std::string log = absl::StrCat(dir_, "/", config_.job(), "-dup", k, "-", ++starts_, ".log");
    const pid_t pid = Fork(k, log);
    extra_.push_back(pid);
    return {pid, log};
  }
  // Waits until shard k accepts connections (or its process exits): whether it does.
  bool WaitListening(int k, absl::Duration timeout = absl::Seconds(30)) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      if (Listening(config_.shards(k))) return true;
      if (pids_[k] > 0 && waitpid(pids_[k], nullptr, WNOHANG) == pids_[k]) {
        pids_[k] = -1;
        return false;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }
  bool StartAll() {
    for (int k = 0; k < config_.shards_size(); ++k) Start(k);
    bool ok = true;
    for (int k = 0; k < config_.shards_size(); ++k) ok = WaitListening(k) && ok;
    return ok;
  }
  void Kill(int k) {
    if (pids_[k] > 0) Reap(pids_[k], SIGKILL);
    pids_[k] = -1;
  }
  // SIGTERM, as Kubernetes stops a pod (the shard writes its final checkpoint); waits for
  // the exit and returns waitpid's status.
  int Stop(int k) {
    int status = -1;
    if (pids_[k] > 0) {
      kill(pids_[k], SIGTERM);
      waitpid(pids_[k], &status, 0);
    }
    pids_[k] = -1;
    return status;
  }
  // Shard k starts (from now on) in the network namespace at `path` (IsolatedHost).
  void SetNetns(int k, std::string path) {
    if (netns_.size() < pids_.size()) netns_.resize(pids_.size());
    netns_[k] = std::move(path);
  }
  void Signal(int k, int sig) {
    if (pids_[k] > 0) kill(pids_[k], sig);
  }

 private:
  // Not gcomp::Spawn: its child gets SIGTERM when the forking *thread* exits, and the fault
  // harness restarts shards from a short-lived injector thread.
  pid_t Fork(int k, const std::string& log) {
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      if (static_cast<size_t>(k) < netns_.size() && !netns_[k].empty()) {
        const int ns = open(netns_[k].c_str(), O_RDONLY);
        if (ns < 0 || setns(ns, CLONE_NEWNET) != 0) {
          perror(("joining the network namespace " + netns_[k]).c_str());
          _exit(126);
        }
      }
      std::vector<std::string> args = {server_, "--config", config_path_, "--shard",
                                       std::to_string(k), "--metrics_address", "none",
                                       "--shutdown_grace_ms", "500"};
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(server_.c_str(), argv.data());
      _exit(127);
    }
    return pid;
  }
  static void Reap(pid_t pid, int sig) {
    kill(pid, SIGCONT);
    kill(pid, sig);
    waitpid(pid, nullptr, 0);
  }

  const std::string server_;
  const std::string dir_;
  const proto::ClusterConfig config_;
  std::string config_path_;
  std::vector<pid_t> pids_;
  std::vector<std::string> logs_;
  std::vector<std::string> netns_;  // by shard; empty: this process's network
  std::vector<pid_t> extra_;
  int starts_ = 0;
};

// What a verifying training run produced: every worker's final values of every tensor, or
// the first error.
struct TrainResult {
  std::vector<std::vector<std::vector<float>>> finals;  // [worker][tensor]
  absl::Status error;
};

struct TrainOptions {
  int workers = 3;
  int steps = 10;
  // Steps first_step to steps - 1 run (a job resumed from a checkpoint starts past 0).
  int first_step = 0;
  std::vector<std::pair<std::string, size_t>> tensors = {{"w1", 5000}, {"w2", 777}, {"b", 3}};
  // Called by worker 0 once it has the results of each step.
  std::function<void(int step)> after_step;
  // Each worker waits this long before each step (a run long enough for faults to land
  // in the middle of it: a restart, a catch-up).
  absl::Duration step_pause = absl::ZeroDuration();
};

inline TrainResult Train(const proto::ClusterConfig& config, const TrainOptions& o) {
  TrainResult result;
  result.finals.resize(o.workers);
  absl::Mutex mu;
  std::vector<std::thread> threads;
  for (int w = 0; w < o.workers; ++w) {
    threads.emplace_back([&, w] {
      auto fail = [&](absl::Status s) {
        absl::MutexLock l(&mu);
        if (result.error.ok()) result.error = s;
      };
      worker::ClientOptions options;
      options.worker = w;
      auto client = worker::Client::Connect(config, options);
      if (!client.ok()) return fail(client.status());
      for (size_t i = 0; i < o.tensors.size(); ++i) {
        const auto& [key, n] = o.tensors[i];
        std::vector<float> initial = SyntheticGradient(n, 77 + static_cast<uint32_t>(i));
        absl::Status s = (*client)->Declare(key, codec::DType::kF32, n, initial.data());
        if (!s.ok()) return fail(s);
      }
      std::vector<std::vector<float>> out(o.tensors.size());
      for (int step = o.first_step; step < o.steps; ++step) {
        absl::SleepFor(o.step_pause);
        for (size_t i = 0; i < o.tensors.size(); ++i) {
          const auto& [key, n] = o.tensors[i];
          std::vector<float> g =
              SyntheticGradient(n, static_cast<uint32_t>(1000 * step + 10 * w + i + 1));
          out[i].resize(n);
          absl::Status s = (*client)->PushPull(key, step, g.data(), out[i].data());
          if (!s.ok()) {
            return fail(absl::Status(s.code(), absl::StrCat("worker ", w, " step ", step, ": ",
                                                            s.message())));
          }
        }
        if (w == 0 && o.after_step) o.after_step(step);
      }
      absl::MutexLock l(&mu);
      result.finals[w] = std::move(out);
    });
  }
  for (std::thread& t : threads) t.join();
  return result;
}

// The same training through in-process shards of `config` that nothing disturbs: the
// reference a faulty run is compared with.
inline TrainResult TrainUndisturbed(const proto::ClusterConfig& config, const TrainOptions& o) {
  std::vector<std::unique_ptr<server::ShardServer>> shards;
  for (int k = 0; k < config.shards_size(); ++k) {
    auto s = server::ShardServer::Start(config, {static_cast<uint32_t>(k), 2, {}}, config.shards(k));
    if (!s.ok()) {
      TrainResult r;
      r.error = s.status();
      return r;
    }
    shards.push_back(*std::move(s));
  }
  TrainOptions plain = o;
  plain.after_step = nullptr;
  plain.step_pause = absl::ZeroDuration();
  return Train(config, plain);
}

// "" when every worker's every tensor is bit-identical in a and b; else the first difference.
inline std::string FirstDifference(const TrainResult& a, const TrainResult& b) {
  if (a.finals.size() != b.finals.size()) return "different worker counts";
  for (size_t w = 0; w < a.finals.size(); ++w) {
    if (a.finals[w].size() != b.finals[w].size()) return absl::StrCat("worker ", w, ": missing");
    for (size_t i = 0; i < a.finals[w].size(); ++i) {
      if (a.finals[w][i].size() != b.finals[w][i].size() ||
          std::memcmp(a.finals[w][i].data(), b.finals[w][i].data(), a.finals[w][i].size() * 4) != 0) {
        return absl::StrCat("worker ", w, " tensor ", i, " differs");
      }
    }
  }
  return "";
}

}  // namespace gcomp::testing

#endif  // GCOMP_TESTS_SHARD_PROCESSES_H_
