#include "cluster/config_fields.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "base/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace gcomp::cluster::config_fields {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("cluster config field '", field, "': ", what));
}

namespace {

// In the order the YAML output writes them; a group's fields stand together.
constexpr Field kFields[] = {
    {"job", Kind::kString, "default"},
    {"workers", Kind::kUnsigned, "1"},
    {"shards", Kind::kShardList, nullptr},
    {"shard_map_epoch", Kind::kUnsigned, "1"},
    {"chunk_bytes", Kind::kUnsigned, "1048576"},
    {"replicas", Kind::kUnsigned, "1"},  // written as given: 0 reads as 1
    {"uplink.mode", Kind::kString, "near-lossless"},
    {"uplink.rel_bits", Kind::kClampedInt, "7"},
    {"uplink.abs_log2", Kind::kClampedInt, "-16"},
    {"downlink.mode", Kind::kString, "near-lossless"},
    {"downlink.rel_bits", Kind::kClampedInt, "7"},
    {"downlink.abs_log2", Kind::kClampedInt, "-16"},
    {"optimizer.name", Kind::kString, "none"},
    {"optimizer.learning_rate", Kind::kDouble, "0.01"},
    {"optimizer.momentum", Kind::kDouble, "0.9"},
    {"optimizer.beta1", Kind::kDouble, "0.9"},
    {"optimizer.beta2", Kind::kDouble, "0.999"},
    {"optimizer.epsilon", Kind::kDouble, "1e-8"},
    {"step_timeout_ms", Kind::kUnsigned, "10000"},
    {"rpc_timeout_ms", Kind::kUnsigned, "30000"},
    {"connect_timeout_ms", Kind::kUnsigned, "5000"},
    {"channels_per_shard", Kind::kUnsigned, "2"},
    {"max_inflight_chunks", Kind::kUnsigned, "4"},
    {"max_retries", Kind::kUnsigned, "5"},
    {"retry_backoff_ms", Kind::kUnsigned, "50"},
    {"max_message_bytes", Kind::kUnsigned, "0"},  // 0: derived from chunk_bytes
    {"security.ca_file", Kind::kString, nullptr},
    {"security.cert_file", Kind::kString, nullptr},
    {"security.key_file", Kind::kString, nullptr},
    {"security.token_file", Kind::kString, nullptr},
    {"security.health_port", Kind::kUnsigned, nullptr},
    {"security.cert_refresh_s", Kind::kUnsigned, "60"},
    {"limits.memory_budget_bytes", Kind::kUnsigned, "0"},  // 0: cgroup limit or physical memory
    {"limits.max_tensors", Kind::kUnsigned, "16384"},
    {"limits.max_key_bytes", Kind::kUnsigned, "1024"},
    {"limits.max_pending_steps", Kind::kUnsigned, "65536"},
    {"limits.max_pending_bytes", Kind::kUnsigned, "0"},  // 0: only the memory budget bounds them
    {"limits.max_calls_per_client", Kind::kUnsigned, "1024"},
    {"limits.max_connections", Kind::kUnsigned, "0"},  // 0: derived from workers and channels
    {"checkpoint.dir", Kind::kString, nullptr},
    {"checkpoint.every_steps", Kind::kUnsigned, nullptr},
    {"checkpoint.keep", Kind::kUnsigned, "2"},
    {"coordination.etcd", Kind::kStringList, nullptr},
    {"coordination.lease_ttl_ms", Kind::kUnsigned, "5000"},
    {"coordination.request_timeout_ms", Kind::kUnsigned, "1000"},
};

absl::StatusOr<std::string> Scalar(const YAML::Node& node, absl::string_view field) {
  if (!node.IsScalar()) return FieldError(field, "expected a scalar value");
  // Strings land in proto3 string fields, which must hold UTF-8 (YAML text is UTF-8 too;
  // the emitter would replace stray bytes, so the config would not round-trip).
  if (!IsValidUtf8(node.Scalar())) return FieldError(field, "not valid UTF-8 text");
  // No name, address or path holds one; and yaml-cpp writes a trailing CR unquoted, which
  // its parser then reads as part of the line break (the config would not round-trip).
  for (size_t i = 0; i < node.Scalar().size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(node.Scalar()[i]);
    if (c < 0x20 || c == 0x7f) {
      return FieldError(field, absl::StrFormat("control character 0x%02x at byte %d", c, i));
    }
  }
  return node.Scalar();
}

absl::StatusOr<uint64_t> ParseU64(const YAML::Node& node, absl::string_view field,
                                  uint64_t max = std::numeric_limits<uint64_t>::max()) {
  absl::StatusOr<std::string> s = Scalar(node, field);
  if (!s.ok()) return s.status();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(*s, &v)) {
    return FieldError(field, absl::StrCat("expected a non-negative integer, got '", *s, "'"));
  }
  if (v > max) return FieldError(field, absl::StrCat("must be at most ", max, ", got ", v));
  return v;
}

absl::StatusOr<int64_t> ParseI64(const YAML::Node& node, absl::string_view field) {
  absl::StatusOr<std::string> s = Scalar(node, field);
  if (!s.ok()) return s.status();
  int64_t v = 0;
  if (!absl::SimpleAtoi(*s, &v)) {
    return FieldError(field, absl::StrCat("expected an integer, got '", *s, "'"));
  }
  return v;
}

absl::StatusOr<double> ParseDouble(const YAML::Node& node, absl::string_view field) {
  absl::StatusOr<std::string> s = Scalar(node, field);
  if (!s.ok()) return s.status();
  double v = 0;
  if (!absl::SimpleAtod(*s, &v) || !std::isfinite(v)) {
    return FieldError(field, absl::StrCat("expected a finite number, got '", *s, "'"));
  }
  return v;
}

// `shards: {count: N, address: "gcomp-shard-{index}.gcomp-shard:7000"}`: the list of a
// StatefulSet's N pods, {index} replaced by 0..N-1.
absl::Status ExpandShardTemplate(const YAML::Node& n, proto::ClusterConfig* c) {
  std::optional<uint64_t> count;
  std::optional<std::string> address;
  for (const auto& kv : n) {
    if (!kv.first.IsScalar()) return FieldError("shards", "keys must be count and address");
    const std::string key = kv.first.Scalar();
    if (key == "count") {
      absl::StatusOr<std::string> v = Scalar(kv.second, "shards.count");
      if (!v.ok()) return v.status();
      uint64_t parsed = 0;
      if (!absl::SimpleAtoi(*v, &parsed) || parsed < 1 || parsed > 4096) {
        return FieldError("shards.count", absl::StrCat("must be in [1, 4096], got '", *v, "'"));
      }
      count = parsed;
    } else if (key == "address") {
      absl::StatusOr<std::string> v = Scalar(kv.second, "shards.address");
      if (!v.ok()) return v.status();
      if (v->find("{index}") == std::string::npos) {
        return FieldError("shards.address",
                          absl::StrCat("must contain {index} (each shard's number), got '", *v, "'"));
      }
      address = *v;
    } else {
      return FieldError(absl::StrCat("shards.", key), "unknown field (count, address)");
    }
  }
  if (!count) return FieldError("shards.count", "required with shards.address");
  if (!address) return FieldError("shards.address", "required with shards.count");
  for (uint64_t i = 0; i < *count; ++i) {
    c->add_shards(absl::StrReplaceAll(*address, {{"{index}", absl::StrCat(i)}}));
  }
  return absl::OkStatus();
}

absl::Status SetShards(const YAML::Node& n, proto::ClusterConfig* c) {
  c->clear_shards();
  if (n.IsScalar()) {
    absl::StatusOr<std::string> list = Scalar(n, "shards");
    if (!list.ok()) return list.status();
    for (absl::string_view s : absl::StrSplit(*list, ',', absl::SkipEmpty())) {
      c->add_shards(std::string(s));
    }
    return absl::OkStatus();
  }
  if (n.IsMap()) return ExpandShardTemplate(n, c);
  if (!n.IsSequence()) {
    return FieldError("shards", "expected a list of host:port, or {count: N, address: "
                                "\"name-{index}.service:port\"}");
  }
  for (size_t i = 0; i < n.size(); ++i) {
    absl::StatusOr<std::string> s = Scalar(n[i], absl::StrCat("shards[", i, "]"));
    if (!s.ok()) return s.status();
    c->add_shards(*s);
  }
  return absl::OkStatus();
}

// The message that holds the field named by a dotted path, and the field's descriptor.
// Every name resolves: the table is fixed, and config_fields_test sets each entry.
// M is Message (walking creates the groups) or const Message.
template <typename M>
std::pair<M*, const FieldDescriptor*> Locate(absl::string_view name, M* root) {
  M* msg = root;
  std::vector<absl::string_view> parts = absl::StrSplit(name, '.');
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    const FieldDescriptor* group = msg->GetDescriptor()->FindFieldByName(std::string(parts[i]));
    if constexpr (std::is_const_v<M>) {
      msg = &msg->GetReflection()->GetMessage(*msg, group);
    } else {
      msg = msg->GetReflection()->MutableMessage(msg, group);
    }
  }
  return {msg, msg->GetDescriptor()->FindFieldByName(std::string(parts.back()))};
}

absl::string_view GroupOf(absl::string_view name) {
  const size_t dot = name.rfind('.');
  return dot == absl::string_view::npos ? absl::string_view() : name.substr(0, dot);
}

}  // namespace

absl::Span<const Field> All() { return kFields; }

const Field* Find(absl::string_view name) {
  for (const Field& f : kFields) {
    if (name == f.name) return &f;
  }
  return nullptr;
}

bool IsGroup(absl::string_view name) {
  for (const Field& f : kFields) {
    if (!name.empty() && GroupOf(f.name) == name) return true;
  }
  return false;
}

absl::Status Set(const Field& field, const YAML::Node& node, proto::ClusterConfig* config) {
  if (field.kind == Kind::kShardList) return SetShards(node, config);
  auto [msg, fd] = Locate<Message>(field.name, config);
  const Reflection* r = msg->GetReflection();
  switch (field.kind) {
    case Kind::kString: {
      absl::StatusOr<std::string> s = Scalar(node, field.name);
      if (!s.ok()) return s.status();
      r->SetString(msg, fd, *s);
      return absl::OkStatus();
    }
    case Kind::kUnsigned: {
      const bool wide = fd->cpp_type() == FieldDescriptor::CPPTYPE_UINT64;
      absl::StatusOr<uint64_t> v = ParseU64(node, field.name,
                                            wide ? std::numeric_limits<uint64_t>::max()
                                                 : std::numeric_limits<uint32_t>::max());
      if (!v.ok()) return v.status();
      if (wide) {
        r->SetUInt64(msg, fd, *v);
      } else {
        r->SetUInt32(msg, fd, static_cast<uint32_t>(*v));
      }
      return absl::OkStatus();
    }
    case Kind::kClampedInt: {
      absl::StatusOr<int64_t> v = ParseI64(node, field.name);
      if (!v.ok()) return v.status();
      // Far out of every such field's range: refused here, naming the value as written
      // (clamping it first made the range check name the clamp instead).
      if (*v < -1000 || *v > 1000) {
        return FieldError(field.name, absl::StrCat("out of range, got ", *v));
      }
      r->SetInt32(msg, fd, static_cast<int32_t>(*v));
      return absl::OkStatus();
    }
    case Kind::kDouble: {
      absl::StatusOr<double> v = ParseDouble(node, field.name);
      if (!v.ok()) return v.status();
      r->SetDouble(msg, fd, *v);
      return absl::OkStatus();
    }
    case Kind::kStringList: {
      r->ClearField(msg, fd);
      if (node.IsScalar()) {
        absl::StatusOr<std::string> list = Scalar(node, field.name);
        if (!list.ok()) return list.status();
        for (absl::string_view item : absl::StrSplit(*list, ',', absl::SkipWhitespace())) {
          r->AddString(msg, fd, std::string(absl::StripAsciiWhitespace(item)));
        }
        return absl::OkStatus();
      }
      if (!node.IsSequence()) return FieldError(field.name, "expected a list of strings");
      for (size_t i = 0; i < node.size(); ++i) {
        absl::StatusOr<std::string> item = Scalar(node[i], absl::StrCat(field.name, "[", i, "]"));
        if (!item.ok()) return item.status();
        r->AddString(msg, fd, *item);
      }
      return absl::OkStatus();
    }
    case Kind::kShardList:
      break;
  }
  return absl::InternalError(absl::StrCat("config field '", field.name, "' has no kind"));
}

proto::ClusterConfig Defaults() {
  // Built once: every config parse starts from it, and building it parses each default
  // through yaml-cpp (a third of a short config's parse time).
  static const proto::ClusterConfig* const defaults = [] {
    auto* c = new proto::ClusterConfig;
    for (const Field& f : kFields) {
      if (f.default_value == nullptr) continue;
      const absl::Status s = Set(f, YAML::Node(std::string(f.default_value)), c);
      (void)s;  // every default parses: config_fields_test checks them
    }
    return c;
  }();
  return *defaults;
}

void Emit(const proto::ClusterConfig& config, YAML::Emitter& out) {
  out << YAML::BeginMap;
  absl::string_view open_group;
  for (const Field& f : kFields) {
    const absl::string_view group = GroupOf(f.name);
    if (group != open_group) {
      if (!open_group.empty()) out << YAML::EndMap;
      if (!group.empty()) out << YAML::Key << std::string(group) << YAML::Value << YAML::BeginMap;
      open_group = group;
    }
    const absl::string_view key = group.empty() ? f.name : f.name + group.size() + 1;
    out << YAML::Key << std::string(key) << YAML::Value;
    if (f.kind == Kind::kShardList) {
      out << YAML::BeginSeq;
      for (const std::string& s : config.shards()) out << s;
      out << YAML::EndSeq;
      continue;
    }
    auto [msg, fd] = Locate<const Message>(f.name, &config);
    const Reflection* r = msg->GetReflection();
    if (f.kind == Kind::kStringList) {
      out << YAML::BeginSeq;
      for (int i = 0; i < r->FieldSize(*msg, fd); ++i) out << r->GetRepeatedString(*msg, fd, i);
      out << YAML::EndSeq;
      continue;
    }
    switch (fd->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        out << r->GetString(*msg, fd);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        out << r->GetUInt32(*msg, fd);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        out << r->GetUInt64(*msg, fd);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        out << r->GetInt32(*msg, fd);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        out << YAML::Precision(17) << r->GetDouble(*msg, fd);
        break;
      default:
        out << YAML::Null;
        break;
    }
  }
  if (!open_group.empty()) out << YAML::EndMap;
  out << YAML::EndMap;
}

}  // namespace gcomp::cluster::config_fields
