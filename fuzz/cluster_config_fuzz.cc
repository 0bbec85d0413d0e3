// Fuzz target: the cluster config parser (cluster::ParseClusterConfig, ClusterConfigToYaml).
//
// The input is the YAML/JSON text, optionally followed by a NUL byte and overrides, one
// "field=value" per line (as a binary's --set gives them). Properties: every error is
// InvalidArgument (cluster_config.h); an accepted config validates, and its YAML text
// parses back to the same config (the round trip the header promises).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cluster/cluster_config.h"
#include "fuzz/fuzz_support.h"
#include "google/protobuf/util/message_differencer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gcomp::fuzz::Check;
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const absl::string_view text = input.substr(0, nul);
  std::vector<std::string> overrides;
  if (nul != absl::string_view::npos) {
    overrides = absl::StrSplit(input.substr(nul + 1), '\n', absl::SkipEmpty());
  }
  absl::StatusOr<gcomp::proto::ClusterConfig> config =
      gcomp::cluster::ParseClusterConfig(text, overrides);
  if (!config.ok()) {
    gcomp::fuzz::CheckCode(config.status(), {absl::StatusCode::kInvalidArgument},
                           "ParseClusterConfig");
    return 0;
  }
  const absl::Status valid = gcomp::cluster::ValidateClusterConfig(*config);
  Check(valid.ok(), absl::StrCat("an accepted config does not validate: ", valid.ToString()));
  const std::string yaml = gcomp::cluster::ClusterConfigToYaml(*config);
  absl::StatusOr<gcomp::proto::ClusterConfig> again = gcomp::cluster::ParseClusterConfig(yaml);
  Check(again.ok(), absl::StrCat("ClusterConfigToYaml output does not parse: ",
                                 again.status().ToString(), "\n", yaml));
  Check(google::protobuf::util::MessageDifferencer::Equals(*config, *again),
        absl::StrCat("config changed in a YAML round trip:\n", config->DebugString(), "---\n",
                     again->DebugString()));
  return 0;
}
