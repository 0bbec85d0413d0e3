// main() of a fuzz target built without libFuzzer: runs every file (or every file under
// every folder) named on the command line through the target once, as
//   bazel run //fuzz:codec_block_fuzz -- $PWD/fuzz/regressions/codec_block
// A crash is the target's crash; otherwise prints how many inputs ran.
#include <cstdio>

#include "fuzz/replay.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  size_t ran = 0;
  for (int i = 1; i < argc; ++i) {
    const std::vector<std::string> files = gcomp::fuzz::ListInputs(argv[i]);
    if (files.empty()) {
      std::fprintf(stderr, "%s: no inputs at %s\n", argv[0], argv[i]);
      return 1;
    }
    for (const std::string& file : files) {
      absl::StatusOr<std::string> bytes = gcomp::fuzz::ReadInput(file);
      if (!bytes.ok()) {
        std::fprintf(stderr, "%s\n", bytes.status().ToString().c_str());
        return 1;
      }
      LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size());
      ++ran;
    }
  }
  std::printf("replayed %zu inputs\n", ran);
  return 0;
}
