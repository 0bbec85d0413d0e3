// Reading fuzz inputs back from files: what the replay tool and the replay tests share.
#ifndef GCOMP_FUZZ_REPLAY_H_
#define GCOMP_FUZZ_REPLAY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gcomp::fuzz {

// The regular files under `path` (itself, if it is a file), sorted; hidden files (names
// starting with '.') are skipped. An empty list if `path` does not exist.
std::vector<std::string> ListInputs(const std::string& path);

// The bytes of the file; NotFound naming it if it cannot be read.
absl::StatusOr<std::string> ReadInput(const std::string& path);

}  // namespace gcomp::fuzz

// Defined by every fuzz target (the libFuzzer entry point).
extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

#endif  // GCOMP_FUZZ_REPLAY_H_
