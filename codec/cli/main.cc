// gcomp: compress / decompress / inspect / bench float32 .npy gradients with the GComp codec.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/build_info.h"
#include "base/thread_pool.h"
#include "codec/cli/commands.h"

ABSL_FLAG(std::string, mode, "near-lossless", "lossless | near-lossless");
ABSL_FLAG(int, rel_bits, 7, "R: mantissa bits kept near the block's largest exponent");
ABSL_FLAG(int, abs_log2, -16, "A: absolute error floor 2^A * (block max)");
ABSL_FLAG(std::string, dtype, "f32", "f32 | bf16 | f16 (the float32 input is rounded first)");
ABSL_FLAG(int, threads, 0, "worker threads; 0 = hardware concurrency");
ABSL_FLAG(int, repeats, 5, "bench: timings are the best of this many runs");

namespace {

constexpr char kUsage[] =
    "usage:\n"
    "  gcomp compress   [--mode lossless|near-lossless] [--rel-bits R] [--abs-log2 A]\n"
    "                   [--dtype f32|bf16|f16] [--threads N] IN.npy OUT.gcz\n"
    "  gcomp decompress [--threads N] IN.gcz OUT.npy\n"
    "  gcomp inspect    IN.gcz\n"
    "  gcomp bench      [--threads N] [--repeats K] FILE.npy...";

int Fail(const std::string& message) {
  std::cerr << "gcomp: " << message << "\n";
  return 1;
}

// More threads than this only adds stacks: blocks are 1 MiB, so no file of up to 2^34
// elements keeps more busy.
constexpr int kMaxThreads = 1024;

int Threads() {
  const int t = absl::GetFlag(FLAGS_threads);
  return t > 0 ? t : gcomp::ThreadPool::HardwareThreads();
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  // Accept the dashed spellings (--rel-bits) of the underscore flag names.
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a.size() > 2 && a.compare(0, 2, "--") == 0) {
      for (size_t j = 2; j < a.size() && a[j] != '='; ++j) {
        if (a[j] == '-') a[j] = '_';
      }
    }
  }
  std::vector<char*> cargs;
  for (std::string& a : args) cargs.push_back(a.data());
  gcomp::InstallVersionFlag("gcomp");
  std::vector<char*> positional = absl::ParseCommandLine(static_cast<int>(cargs.size()),
                                                         cargs.data());
  if (positional.size() < 2) {
    return Fail("missing subcommand (compress, decompress, inspect or bench); see --help");
  }
  const std::string command = positional[1];
  if (const int t = absl::GetFlag(FLAGS_threads); t < 0 || t > kMaxThreads) {
    return Fail(
        absl::StrCat("--threads must be 0 (every hardware thread) to ", kMaxThreads, ", got ", t));
  }
  if (const int r = absl::GetFlag(FLAGS_repeats); r < 1) {
    return Fail(absl::StrCat("--repeats must be at least 1, got ", r));
  }
  const std::vector<std::string> files(positional.begin() + 2, positional.end());

  absl::Status st;
  if (command == "compress") {
    if (files.size() != 2) return Fail("compress needs IN.npy OUT.gcz");
    gcomp::cli::CompressOptions options;
    absl::StatusOr<gcomp::codec::Mode> mode = gcomp::codec::ParseMode(absl::GetFlag(FLAGS_mode));
    if (!mode.ok()) return Fail(std::string(mode.status().message()));
    absl::StatusOr<gcomp::codec::DType> dtype =
        gcomp::codec::ParseDType(absl::GetFlag(FLAGS_dtype));
    if (!dtype.ok()) return Fail(std::string(dtype.status().message()));
    options.policy.mode = *mode;
    options.policy.rel_bits = absl::GetFlag(FLAGS_rel_bits);
    options.policy.abs_log2 = absl::GetFlag(FLAGS_abs_log2);
    if (absl::Status v = gcomp::codec::ValidatePolicy(options.policy); !v.ok()) {
      return Fail(std::string(v.message()));
    }
    options.dtype = *dtype;
    options.threads = Threads();
    options.warnings = &std::cerr;
    st = gcomp::cli::Compress(files[0], files[1], options);
  } else if (command == "decompress") {
    if (files.size() != 2) return Fail("decompress needs IN.gcz OUT.npy");
    st = gcomp::cli::Decompress(files[0], files[1], Threads());
  } else if (command == "inspect") {
    if (files.size() != 1) return Fail("inspect needs IN.gcz");
    st = gcomp::cli::Inspect(files[0], std::cout);
  } else if (command == "bench") {
    gcomp::cli::BenchOptions options;
    options.threads = Threads();
    options.repeats = absl::GetFlag(FLAGS_repeats);
    st = gcomp::cli::Bench(files, options, std::cout);
  } else {
    return Fail(absl::StrCat("unknown subcommand '", command,
                             "' (want compress, decompress, inspect or bench)"));
  }
  if (!st.ok()) return Fail(std::string(st.message()));
  return 0;
}
