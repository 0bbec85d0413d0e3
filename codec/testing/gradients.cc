#include "codec/testing/gradients.h"

#include <dirent.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace gcomp::codec::testing {

absl::StatusOr<std::vector<std::string>> GradientFiles() {
  const char* dir = std::getenv("GCOMP_GRADIENTS_DIR");
  if (dir == nullptr || *dir == '\0') {
    return absl::NotFoundError(
        "GCOMP_GRADIENTS_DIR is not set; run with "
        "--test_env=GCOMP_GRADIENTS_DIR=/path/to/shared/data/gradients");
  }
  DIR* d = opendir(dir);
  if (d == nullptr) {
    return absl::NotFoundError(absl::StrCat("GCOMP_GRADIENTS_DIR=", dir, " cannot be opened"));
  }
  std::vector<std::string> files;
  while (struct dirent* e = readdir(d)) {
    if (absl::EndsWith(e->d_name, ".npy")) files.push_back(absl::StrCat(dir, "/", e->d_name));
  }
  closedir(d);
  if (files.empty()) {
    return absl::NotFoundError(absl::StrCat("no .npy files in GCOMP_GRADIENTS_DIR=", dir));
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace gcomp::codec::testing
