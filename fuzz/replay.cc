#include "fuzz/replay.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace gcomp::fuzz {

std::vector<std::string> ListInputs(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return {path};
  if (!fs::is_directory(path, ec)) return files;
  // Bazel's runfiles are symlinks: follow them.
  for (fs::recursive_directory_iterator it(path, fs::directory_options::follow_directory_symlink,
                                           ec),
       end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (fs::is_regular_file(it->path(), ec)) files.push_back(it->path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::string> ReadInput(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read fuzz input ", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

}  // namespace gcomp::fuzz
