// The gcomp subcommands. Options come from main() as structs; every error is a Status whose
// message is fit for one line on stderr.
#ifndef GCOMP_CODEC_CLI_COMMANDS_H_
#define GCOMP_CODEC_CLI_COMMANDS_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "codec/codec.h"

namespace gcomp::cli {

struct CompressOptions {
  codec::Policy policy;
  codec::DType dtype = codec::DType::kF32;  // the float32 input is rounded to this first
  int threads = 1;
  // Where a warning goes (finite values that became +-Inf in the rounding); null: nowhere.
  std::ostream* warnings = nullptr;
};

// IN.npy (float32) -> OUT.gcz, written through a temporary file and a rename.
absl::Status Compress(const std::string& in_path, const std::string& out_path,
                      const CompressOptions& options);
// IN.gcz -> OUT.npy (float32, widened exactly), written the same way.
absl::Status Decompress(const std::string& in_path, const std::string& out_path, int threads);
// Writes a JSON description of IN.gcz (elements, zeros, bytes and bits/element per section).
absl::Status Inspect(const std::string& in_path, std::ostream& out);

struct BenchOptions {
  int threads = 1;    // the "all threads" column
  int repeats = 5;    // timings are the best of this many runs
  size_t block_bytes = size_t{1} << 20;
};
// Prints, per file, ratio and GB/s for gcomp lossless / near-lossless, zstd -1/-3 and lz4.
absl::Status Bench(const std::vector<std::string>& paths, const BenchOptions& options,
                   std::ostream& out);

}  // namespace gcomp::cli

#endif  // GCOMP_CODEC_CLI_COMMANDS_H_
