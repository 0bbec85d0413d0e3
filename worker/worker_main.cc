// gcomp_worker --config FILE --worker W --gradients A.npy[,B.npy] --steps N
//
// Replays real gradients as worker W of a job: each file is one f32 tensor (key = its
// index, "g0", "g1", ...), declared once, then pushed every step scaled by
// ScaleFactor(w, step) so that the mean over workers is known. With --verify (the default)
// every result is checked against the uncompressed reference computed locally (the same
// sums in the same order) and the codec's error bound; the launcher verifies on one worker
// only, since it checks separately that all workers got identical bytes (the digest), and
// W workers each recomputing the reference would crowd the CPU the steps are timed on.
// Prints one JSON line on stdout:
//   {"worker":..,"ok":..,"steps":..,"raw_bytes":..,"wire_bytes":..,"max_abs_error":..,
//    "bound_ok":..,"bound_checked":..,"exact":..,"digest":"..","step_ms":[..],"retries":..,
//    "map_switches":..,"down_reports":..,
//    "error":".."}
// and exits 0 only if every step succeeded and bound_ok holds. On a terminal, stderr shows a
// progress line (step, steps/s, ratio, ETA; --progress=auto|always|never).
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "base/build_info.h"
#include "base/json.h"
#include "base/large_buffer.h"
#include "base/log_flags.h"
#include "base/logging.h"
#include "base/malloc_tuning.h"
#include "base/mutex_mode.h"
#include "base/npy.h"
#include "base/progress.h"
#include "base/progress_flags.h"
#include "cluster/cluster_config.h"
#include "cluster/config_flags.h"
#include "cluster/optimizer.h"
#include "cluster/shard_map.h"
#include "codec/codec.h"
#include "worker/client.h"
#include "xxhash.h"

ABSL_FLAG(int, worker, 0, "This worker's id.");
ABSL_FLAG(std::string, name, "", "Name the shards use for this worker in errors.");
ABSL_FLAG(std::vector<std::string>, gradients, {}, "Comma-separated float32 .npy files.");
ABSL_FLAG(int, steps, 3, "Steps to run.");
ABSL_FLAG(bool, verify, true,
          "Check every result against the locally computed reference and error bound.");
ABSL_FLAG(int, kill_at_step, -1,
          "Testing: SIGKILL this process in the middle of this step (after its pushes start).");
ABSL_FLAG(std::string, metrics_address, "",
          "Serve this worker's Prometheus metrics on http://ADDRESS/metrics (port 0 picks a "
          "free one). Empty: none.");
ABSL_FLAG(std::string, progress_file, "",
          "If set, 'steps raw_bytes wire_bytes' (completed steps, bytes as if uncompressed, "
          "bytes on the wire) is rewritten into this file after each step (the local "
          "launcher's progress line and soak check read it).");
ABSL_FLAG(int64_t, defer_checks_bytes, int64_t{1} << 30,
          "Results kept for checking after the run, at most (0: check each step at once, so "
          "that memory stays flat in long runs).");

namespace {

using gcomp::codec::DType;

// Worker w's multiplier at `step`; every worker computes every worker's factor.
float ScaleFactor(uint32_t w, int64_t step) {
  return static_cast<float>(w + 1) * (1.0f + static_cast<float>(step) / 16.0f);
}

struct Tensor {
  std::string key;
  std::vector<float> grad;
  std::vector<float> input, output;
  // Optimizer simulation on the exact mean, and error-bound bookkeeping.
  std::unique_ptr<gcomp::cluster::Optimizer> reference;
  std::vector<double> velocity_error;  // momentum
  std::vector<double> param_error;     // sgd / momentum
  // Scratch of the reference check, sized once: allocated and freed every step, these
  // tens of MiB moved the heap between two resident sizes in long soak runs.
  std::vector<float> scaled, sum, abs_sum;
  std::vector<double> up_err, g_err;
};

// codec::ErrorBound of one direction with its powers of two hoisted out of the element
// loops (scaling by a power of two is exact, so the values are the same).
class DirectionBound {
 public:
  explicit DirectionBound(const gcomp::cluster::DirectionCodec& dir)
      : zero_(dir.raw || dir.policy.mode == gcomp::codec::Mode::kLossless),
        rel_(std::ldexp(1.0, -(dir.policy.rel_bits + 1))),
        floor_(std::ldexp(1.0, dir.policy.abs_log2)) {}

  double operator()(double x, double block_max) const {
    if (zero_ || !std::isfinite(x)) return 0.0;
    return std::max(std::fabs(x) * rel_, block_max * floor_);
  }

 private:
  bool zero_;
  double rel_, floor_;
};

// What the run needs before its first step.
struct Job {
  gcomp::proto::ClusterConfig config;
  gcomp::cluster::OptimizerOptions opt;
  std::vector<Tensor> tensors;  // one per --gradients file, declared on the shards
  std::unique_ptr<gcomp::worker::Client> client;
};

// Loads the config and the gradients, connects and declares the tensors; false with
// *error set if one of them fails.
bool PrepareJob(uint32_t w, Job* job, std::string* error) {
  absl::StatusOr<gcomp::proto::ClusterConfig> config = gcomp::cluster::LoadClusterConfigFromFlags();
  if (!config.ok()) {
    *error = config.status().ToString();
    return false;
  }
  job->config = *std::move(config);
  absl::StatusOr<gcomp::cluster::OptimizerKind> kind =
      gcomp::cluster::ParseOptimizerKind(job->config.optimizer().name());
  const gcomp::proto::OptimizerConfig& oc = job->config.optimizer();
  job->opt = gcomp::cluster::OptimizerOptions{*kind,       oc.learning_rate(), oc.momentum(),
                                              oc.beta1(),  oc.beta2(),         oc.epsilon()};
  for (const std::string& path : absl::GetFlag(FLAGS_gradients)) {
    absl::StatusOr<gcomp::NpyArray> a = gcomp::ReadNpyF32(path);
    if (!a.ok()) {
      *error = a.status().ToString();
      return false;
    }
    Tensor t;
    t.key = absl::StrCat("g", job->tensors.size());
    t.grad = std::move(a->data);
    t.input.resize(t.grad.size());
    t.output.resize(t.grad.size());
    t.reference = std::make_unique<gcomp::cluster::Optimizer>(job->opt, t.grad.size());
    t.velocity_error.assign(t.grad.size(), 0.0);
    t.param_error.assign(t.grad.size(), 0.0);
    job->tensors.push_back(std::move(t));
  }
  if (job->tensors.empty()) {
    *error = "--gradients names no file";
    return false;
  }
  gcomp::worker::ClientOptions copt;
  copt.worker = w;
  copt.name = absl::GetFlag(FLAGS_name);
  copt.metrics_address = absl::GetFlag(FLAGS_metrics_address);
  absl::StatusOr<std::unique_ptr<gcomp::worker::Client>> client =
      gcomp::worker::Client::Connect(job->config, copt);
  if (!client.ok()) {
    *error = client.status().ToString();
    return false;
  }
  job->client = *std::move(client);
  for (const Tensor& t : job->tensors) {
    absl::Status s = job->client->Declare(t.key, DType::kF32, t.grad.size());
    if (!s.ok()) {
      *error = s.ToString();
      return false;
    }
  }
  return true;
}

// Checks each step's results against the uncompressed reference computed here (the same
// sums in the same order) and the codec's error bound. Results wait, copied, until the end
// or until --defer_checks_bytes of them: checking costs W times the reference work, and done
// between steps it would stall the next push of every worker.
class ResultCheck {
 public:
  // `job` must outlive the check.
  explicit ResultCheck(Job* job)
      : job_(*job),
        workers_(job->config.workers()),
        up_bound_(gcomp::cluster::UplinkCodec(job->config)),
        down_bound_(gcomp::cluster::DownlinkCodec(job->config)),
        chunk_elements_(
            gcomp::cluster::ChunkLayout(1, 4, job->config.chunk_bytes()).chunk_elements),
        result_offset_(job->tensors.size() + 1, 0) {
    const gcomp::cluster::DirectionCodec up = gcomp::cluster::UplinkCodec(job->config);
    const gcomp::cluster::DirectionCodec down = gcomp::cluster::DownlinkCodec(job->config);
    lossless_ = (up.raw || up.policy.mode == gcomp::codec::Mode::kLossless) &&
                (down.raw || down.policy.mode == gcomp::codec::Mode::kLossless);
    bound_checked_ = absl::GetFlag(FLAGS_verify) &&
                     (lossless_ || job->opt.kind != gcomp::cluster::OptimizerKind::kAdam);
    for (size_t ti = 0; ti < job->tensors.size(); ++ti) {
      result_offset_[ti + 1] = result_offset_[ti] + job->tensors[ti].grad.size();
    }
    size_t step_bytes = 0;
    for (const Tensor& t : job->tensors) step_bytes += t.grad.size() * sizeof(float);
    defer_limit_ = std::max<size_t>(
        1, static_cast<size_t>(std::max<int64_t>(0, absl::GetFlag(FLAGS_defer_checks_bytes))) /
               std::max<size_t>(1, step_bytes));
  }

  // Keeps the tensors' outputs of the next step, checking what was kept once at the limit.
  void Keep() {
    gcomp::LargeBuffer results;
    if (!spare_.empty()) {
      results = std::move(spare_.back());
      spare_.pop_back();
    }
    float* kept = reinterpret_cast<float*>(results.Reserve(result_offset_.back() * sizeof(float)));
    for (size_t ti = 0; ti < job_.tensors.size(); ++ti) {
      std::memcpy(kept + result_offset_[ti], job_.tensors[ti].output.data(),
                  job_.tensors[ti].grad.size() * sizeof(float));
    }
    deferred_.push_back(std::move(results));
    if (deferred_.size() >= defer_limit_) Flush();
  }
  // Checks every step kept so far.
  void Flush() {
    for (gcomp::LargeBuffer& results : deferred_) {
      CheckStep(next_check_++, reinterpret_cast<const float*>(results.data()));
      spare_.push_back(std::move(results));
    }
    deferred_.clear();
  }

  bool bound_checked() const { return bound_checked_; }
  bool bound_ok() const { return bound_ok_; }
  bool exact() const { return exact_; }
  double max_abs_error() const { return max_abs_error_; }

 private:
  // Checks one step's results (every tensor's back to back, tensor i's at
  // result_offset_[i]); steps must come in order, since the reference optimizer advances
  // with each.
  void CheckStep(int step, const float* results);

  Job& job_;
  const uint32_t workers_;
  const DirectionBound up_bound_, down_bound_;
  const size_t chunk_elements_;
  std::vector<size_t> result_offset_;
  bool lossless_ = false;
  bool bound_checked_ = false;
  size_t defer_limit_ = 1;  // steps kept before they are checked

  double max_abs_error_ = 0;
  bool bound_ok_ = true;
  bool exact_ = true;

  // Results of steps not yet checked. Each is a LargeBuffer: new memory in huge pages where
  // the kernel allows (base/large_buffer.h). In vectors, the copy into fresh memory cost this
  // worker 20-40 ms of page faults between steps on the development VM, which every other
  // worker then waited for: a third of the step time of W = 4, S = 2.
  std::vector<gcomp::LargeBuffer> deferred_;
  int next_check_ = 0;  // the step deferred_[0] holds
  // Checked results keep their buffers for the next steps (same reason as Tensor's scratch).
  std::vector<gcomp::LargeBuffer> spare_;
};

void ResultCheck::CheckStep(int step, const float* results) {
  const uint32_t workers = workers_;
  const size_t chunk_elements = chunk_elements_;
  const gcomp::cluster::OptimizerOptions& opt = job_.opt;
  // Reference: the same f32 sums in worker order, then the bound per element.
  for (size_t ti = 0; ti < job_.tensors.size(); ++ti) {
    Tensor& t = job_.tensors[ti];
    const float* output = results + result_offset_[ti];
    const size_t n = t.grad.size();
    std::vector<float>& scaled = t.scaled;
    std::vector<float>& sum = t.sum;
    std::vector<float>& abs_sum = t.abs_sum;
    std::vector<double>& up_err = t.up_err;
    scaled.resize(n);
    sum.resize(n);
    abs_sum.assign(n, 0.0f);
    up_err.assign(n, 0.0);
    for (uint32_t v = 0; v < workers; ++v) {
      const float f = ScaleFactor(v, step);
      for (size_t i = 0; i < n; ++i) scaled[i] = t.grad[i] * f;
      for (size_t c0 = 0; c0 < n; c0 += chunk_elements) {
        const size_t c1 = std::min(n, c0 + chunk_elements);
        double m = 0;
        for (size_t i = c0; i < c1; ++i) {
          if (std::isfinite(scaled[i])) m = std::max(m, std::fabs(double(scaled[i])));
        }
        for (size_t i = c0; i < c1; ++i) {
          up_err[i] += up_bound_(scaled[i], m);
        }
      }
      for (size_t i = 0; i < n; ++i) {
        sum[i] = v == 0 ? scaled[i] : sum[i] + scaled[i];
        abs_sum[i] += std::fabs(scaled[i]);
      }
    }
    for (size_t i = 0; i < n; ++i) sum[i] /= static_cast<float>(workers);
    t.reference->Step(sum);
    const absl::Span<const float> ref = t.reference->value();
    // Gradient error bound (mean of the uplink bounds plus f32 summation slack).
    std::vector<double>& g_err = t.g_err;
    g_err.resize(n);
    for (size_t i = 0; i < n; ++i) {
      g_err[i] = up_err[i] / workers +
                 (workers + 2) * std::ldexp(double(abs_sum[i]) / workers, -24) + 1e-37;
    }
    for (size_t c0 = 0; c0 < n; c0 += chunk_elements) {
      const size_t c1 = std::min(n, c0 + chunk_elements);
      double m = 0, merr = 0;
      for (size_t i = c0; i < c1; ++i) {
        m = std::max(m, std::fabs(double(ref[i])));
      }
      for (size_t i = c0; i < c1; ++i) {
        double e_before_down = 0;
        switch (opt.kind) {
          case gcomp::cluster::OptimizerKind::kNone:
            e_before_down = g_err[i];
            break;
          case gcomp::cluster::OptimizerKind::kSgd:
            t.param_error[i] += opt.learning_rate * g_err[i] * (1 + 1e-6) + 1e-37;
            e_before_down = t.param_error[i];
            break;
          case gcomp::cluster::OptimizerKind::kMomentum:
            t.velocity_error[i] = opt.momentum * t.velocity_error[i] + g_err[i] * (1 + 1e-6);
            t.param_error[i] += opt.learning_rate * t.velocity_error[i] + 1e-37;
            e_before_down = t.param_error[i];
            break;
          case gcomp::cluster::OptimizerKind::kAdam:
            e_before_down = 0;
            break;
        }
        merr = std::max(merr, e_before_down);
        const double got = output[i];
        const double err = std::fabs(got - double(ref[i]));
        max_abs_error_ = std::max(max_abs_error_, err);
        if (std::memcmp(&output[i], &ref[i], 4) != 0) exact_ = false;
        if (!bound_checked_) continue;
        double bound = e_before_down;
        bound += down_bound_(std::fabs(double(ref[i])) + e_before_down,
                             m + merr + e_before_down);
        if (lossless_ ? err != 0 : err > bound * (1 + 1e-9)) {
          if (bound_ok_) {
            gcomp::log::Error("step {} {}[{}]: got {} want {} err {} bound {}", step, t.key, i,
                              got, double(ref[i]), err, bound);
          }
          bound_ok_ = false;
        }
      }
    }
  }
}

// What the steps left behind, for the JSON line.
struct StepsRun {
  int done_steps = 0;
  uint64_t digest = 0;  // XXH64 over every step's results
  std::vector<double> step_ms;
};

// Runs the steps: pushes every tensor scaled for this worker and step, waits for the
// results, reports progress (--progress_file, the progress line) and keeps the results for
// `check` (null without --verify). Stops at the first failed step with *error set.
StepsRun RunSteps(uint32_t w, Job* job, int progress_fd, gcomp::ProgressMode progress_mode,
                  ResultCheck* check, std::string* error) {
  const int steps = absl::GetFlag(FLAGS_steps);
  StepsRun run;
  gcomp::ProgressMeter meter(steps, absl::Now());
  gcomp::ProgressPrinter printer(stderr, gcomp::ProgressEnabled(progress_mode, STDERR_FILENO));
  for (int step = 0; step < steps; ++step) {
    for (Tensor& t : job->tensors) {
      const float f = ScaleFactor(w, step);
      for (size_t i = 0; i < t.grad.size(); ++i) t.input[i] = t.grad[i] * f;
    }
    const absl::Time start = absl::Now();
    std::vector<std::future<absl::Status>> pending;
    for (Tensor& t : job->tensors) {
      pending.push_back(job->client->PushPullAsync(t.key, step, t.input.data(), t.output.data()));
    }
    if (step == absl::GetFlag(FLAGS_kill_at_step)) {
      absl::SleepFor(absl::Milliseconds(50));
      raise(SIGKILL);
    }
    for (auto& p : pending) {
      absl::Status s = p.get();
      if (!s.ok() && error->empty()) *error = s.ToString();
    }
    if (!error->empty()) break;
    run.step_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    ++run.done_steps;
    if (progress_fd >= 0) {
      // "steps raw_bytes wire_bytes", fixed width, rewritten in place: a reader never sees
      // a shorter, stale tail.
      const gcomp::worker::ClientStats cs = job->client->stats();
      const std::string text = absl::StrFormat("%12d %20d %20d\n", run.done_steps,
                                               cs.raw_bytes_sent + cs.raw_bytes_received,
                                               cs.wire_bytes_sent + cs.wire_bytes_received);
      (void)!pwrite(progress_fd, text.data(), text.size(), 0);
    }
    if (printer.enabled()) {
      const gcomp::worker::ClientStats cs = job->client->stats();
      if (std::optional<std::string> line =
              meter.Update(run.done_steps, cs.raw_bytes_sent + cs.raw_bytes_received,
                           cs.wire_bytes_sent + cs.wire_bytes_received, absl::Now())) {
        printer.Show(*line);
      }
    }

    for (const Tensor& t : job->tensors) {
      run.digest = XXH64(t.output.data(), t.grad.size() * 4, run.digest);
    }
    if (check != nullptr) check->Keep();
  }
  printer.Finish();  // the JSON line and any error start on a line of their own
  return run;
}

// The JSON line's fields between "ok" and "error".
std::string SummaryFields(const StepsRun& run, const ResultCheck& check,
                          const gcomp::worker::ClientStats& st) {
  return absl::StrFormat(
      ",\"steps\":%d,\"raw_bytes\":%d,\"wire_bytes\":%d,\"max_abs_error\":%.9g,\"bound_ok\":%s,"
      "\"bound_checked\":%s,\"exact\":%s,\"digest\":\"%016x\",\"retries\":%d,"
      "\"map_switches\":%d,\"down_reports\":%d,\"step_ms\":[%s]",
      run.done_steps, st.raw_bytes_sent + st.raw_bytes_received,
      st.wire_bytes_sent + st.wire_bytes_received, check.max_abs_error(),
      check.bound_ok() ? "true" : "false", check.bound_checked() ? "true" : "false",
      check.exact() ? "true" : "false", run.digest, st.retries, st.map_switches,
      st.down_reports, absl::StrJoin(run.step_ms, ",", [](std::string* out, double v) {
        absl::StrAppend(out, absl::StrFormat("%.3f", v));
      }));
}

}  // namespace

int main(int argc, char** argv) {
  gcomp::TuneMallocForLargeBuffers();
  gcomp::DisableMutexDeadlockDetection();
  const gcomp::PeriodicMallocTrim trim_heap(absl::Seconds(5));
  absl::SetProgramUsageMessage(
      "gcomp_worker --config FILE --worker W --gradients A.npy[,B.npy] --steps N\n"
      "Replays real gradients as worker W of a job; --helpfull lists every flag.");
  gcomp::InstallVersionFlag("gcomp_worker");
  absl::ParseCommandLine(argc, argv);
  const uint32_t w = static_cast<uint32_t>(absl::GetFlag(FLAGS_worker));
  const absl::Status logging =
      gcomp::InitLoggingFromFlags(absl::StrCat("gcomp_worker[", w, "]"), "warn");
  std::string error;
  auto finish = [&](bool ok, const std::string& body) {
    // The error may hold a shard's status message: quoted as JSON, control characters
    // and terminal commands escaped, so the line parses and prints harmlessly.
    std::printf("{\"worker\":%u,\"ok\":%s%s,\"error\":%s}\n", w, ok ? "true" : "false",
                body.c_str(), gcomp::JsonQuote(error).c_str());
    std::fflush(stdout);
    return ok ? 0 : 1;
  };
  if (!logging.ok()) {
    error = logging.ToString();
    return finish(false, "");
  }
  const absl::StatusOr<gcomp::ProgressMode> progress_mode = gcomp::ProgressModeFromFlags();
  if (!progress_mode.ok()) {
    error = progress_mode.status().ToString();
    return finish(false, "");
  }
  Job job;
  if (!PrepareJob(w, &job, &error)) return finish(false, "");
  ResultCheck check(&job);
  int progress_fd = -1;
  if (!absl::GetFlag(FLAGS_progress_file).empty()) {
    progress_fd = open(absl::GetFlag(FLAGS_progress_file).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (progress_fd < 0) {
      error = absl::StrCat("cannot write --progress_file ", absl::GetFlag(FLAGS_progress_file));
      return finish(false, "");
    }
  }
  const StepsRun run = RunSteps(w, &job, progress_fd, *progress_mode,
                                absl::GetFlag(FLAGS_verify) ? &check : nullptr, &error);
  check.Flush();
  return finish(error.empty() && check.bound_ok(),
                SummaryFields(run, check, job.client->stats()));
}
