// Test helper: the shared real gradient files, found through $GCOMP_GRADIENTS_DIR.
#ifndef GCOMP_CODEC_TESTING_GRADIENTS_H_
#define GCOMP_CODEC_TESTING_GRADIENTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace gcomp::codec::testing {

// Sorted paths of the *.npy files in $GCOMP_GRADIENTS_DIR. NotFound (with a message fit for
// GTEST_SKIP) when the variable is unset, the folder is missing, or it holds no .npy file.
absl::StatusOr<std::vector<std::string>> GradientFiles();

}  // namespace gcomp::codec::testing

#endif  // GCOMP_CODEC_TESTING_GRADIENTS_H_
