// The fields of a cluster config that a YAML file or a `field=value` override can set: one
// table (name, kind, default) that the parser, the defaults and the YAML writer all read,
// so a new field is added in one place (plus its rule in ValidateClusterConfig). Private to
// //cluster:cluster_config.
#ifndef GCOMP_CLUSTER_CONFIG_FIELDS_H_
#define GCOMP_CLUSTER_CONFIG_FIELDS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/cluster_config.pb.h"
#include "yaml-cpp/yaml.h"

namespace gcomp::cluster::config_fields {

enum class Kind {
  kString,      // UTF-8 text
  kUnsigned,    // a non-negative integer within the proto field's type
  kClampedInt,  // any integer, clamped to [-1000, 1000] (validation names the real range)
  kDouble,      // a finite number
  kShardList,   // `shards`: a list, a comma-separated string, or {count, address}
  kStringList,  // a list of UTF-8 strings, or one comma-separated string
};

struct Field {
  const char* name;           // dotted path in the config, e.g. "limits.max_tensors"
  Kind kind;
  const char* default_value;  // as written in YAML; nullptr: the proto's zero value
};

// "cluster config field '<field>': <what>" (InvalidArgument).
absl::Status FieldError(absl::string_view field, absl::string_view what);

// Every field, in the order the YAML output writes them.
absl::Span<const Field> All();
// The field called `name`, or nullptr.
const Field* Find(absl::string_view name);
// Whether `name` is a group of fields ("uplink", "limits", ...).
bool IsGroup(absl::string_view name);

// Parses `node` as the field's kind and stores it; errors name the field.
absl::Status Set(const Field& field, const YAML::Node& node, proto::ClusterConfig* config);

// Every field's default (fields without one keep the proto's zero value).
proto::ClusterConfig Defaults();

// Writes every field of `config` as one YAML mapping, groups as nested mappings, in the
// table's order.
void Emit(const proto::ClusterConfig& config, YAML::Emitter& out);

}  // namespace gcomp::cluster::config_fields

#endif  // GCOMP_CLUSTER_CONFIG_FIELDS_H_
