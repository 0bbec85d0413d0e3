#include "cluster/cluster_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/util/message_differencer.h"
#include "yaml-cpp/yaml.h"

namespace gcomp::cluster {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("cluster config field '", field, "': ", what));
}

// Whether `s` is well-formed UTF-8 (RFC 3629: shortest forms, no surrogates, <= U+10FFFF).
bool IsUtf8(absl::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (s.size() - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

absl::StatusOr<std::string> Scalar(const YAML::Node& node, absl::string_view field) {
  if (!node.IsScalar()) return FieldError(field, "expected a scalar value");
  // Strings land in proto3 string fields, which must hold UTF-8 (YAML text is UTF-8 too;
  // the emitter would replace stray bytes, so the config would not round-trip).
  if (!IsUtf8(node.Scalar())) return FieldError(field, "not valid UTF-8 text");
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

using Setter = std::function<absl::Status(const YAML::Node&, proto::ClusterConfig*)>;

Setter U32(absl::string_view field, void (proto::ClusterConfig::*set)(uint32_t)) {
  std::string name(field);
  return [name, set](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
    absl::StatusOr<uint64_t> v = ParseU64(n, name, std::numeric_limits<uint32_t>::max());
    if (!v.ok()) return v.status();
    (c->*set)(static_cast<uint32_t>(*v));
    return absl::OkStatus();
  };
}

Setter U64(absl::string_view field, void (proto::ClusterConfig::*set)(uint64_t)) {
  std::string name(field);
  return [name, set](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
    absl::StatusOr<uint64_t> v = ParseU64(n, name);
    if (!v.ok()) return v.status();
    (c->*set)(*v);
    return absl::OkStatus();
  };
}

// A field of a nested message: `get` reaches the message, `set` stores the value.
template <typename Msg, typename T>
Setter NestedUnsigned(std::string field, Msg* (proto::ClusterConfig::*get)(), void (Msg::*set)(T)) {
  return [field, get, set](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
    absl::StatusOr<uint64_t> v = ParseU64(n, field, std::numeric_limits<T>::max());
    if (!v.ok()) return v.status();
    ((c->*get)()->*set)(static_cast<T>(*v));
    return absl::OkStatus();
  };
}

template <typename Msg>
Setter NestedString(std::string field, Msg* (proto::ClusterConfig::*get)(),
                    void (Msg::*set)(const std::string&)) {
  return [field, get, set](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
    absl::StatusOr<std::string> s = Scalar(n, field);
    if (!s.ok()) return s.status();
    ((c->*get)()->*set)(*s);
    return absl::OkStatus();
  };
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

// Every settable field, by dotted name.
const std::map<std::string, Setter>& Setters() {
  static const auto* setters = [] {
    auto* m = new std::map<std::string, Setter>;
    (*m)["job"] = [](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
      absl::StatusOr<std::string> s = Scalar(n, "job");
      if (!s.ok()) return s.status();
      c->set_job(*s);
      return absl::OkStatus();
    };
    (*m)["workers"] = U32("workers", &proto::ClusterConfig::set_workers);
    (*m)["shards"] = [](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
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
    };
    (*m)["shard_map_epoch"] = U64("shard_map_epoch", &proto::ClusterConfig::set_shard_map_epoch);
    (*m)["chunk_bytes"] = U64("chunk_bytes", &proto::ClusterConfig::set_chunk_bytes);
    for (const char* dir : {"uplink", "downlink"}) {
      auto get = std::string(dir) == "uplink" ? &proto::ClusterConfig::mutable_uplink
                                              : &proto::ClusterConfig::mutable_downlink;
      std::string d(dir);
      (*m)[d + ".mode"] = [get, d](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
        absl::StatusOr<std::string> s = Scalar(n, d + ".mode");
        if (!s.ok()) return s.status();
        (c->*get)()->set_mode(*s);
        return absl::OkStatus();
      };
      (*m)[d + ".rel_bits"] = [get, d](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
        absl::StatusOr<int64_t> v = ParseI64(n, d + ".rel_bits");
        if (!v.ok()) return v.status();
        (c->*get)()->set_rel_bits(static_cast<int32_t>(std::clamp<int64_t>(*v, -1000, 1000)));
        return absl::OkStatus();
      };
      (*m)[d + ".abs_log2"] = [get, d](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
        absl::StatusOr<int64_t> v = ParseI64(n, d + ".abs_log2");
        if (!v.ok()) return v.status();
        (c->*get)()->set_abs_log2(static_cast<int32_t>(std::clamp<int64_t>(*v, -1000, 1000)));
        return absl::OkStatus();
      };
    }
    (*m)["optimizer.name"] = [](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
      absl::StatusOr<std::string> s = Scalar(n, "optimizer.name");
      if (!s.ok()) return s.status();
      c->mutable_optimizer()->set_name(*s);
      return absl::OkStatus();
    };
    using OptSet = void (proto::OptimizerConfig::*)(double);
    for (auto [name, set] : std::vector<std::pair<std::string, OptSet>>{
             {"learning_rate", &proto::OptimizerConfig::set_learning_rate},
             {"momentum", &proto::OptimizerConfig::set_momentum},
             {"beta1", &proto::OptimizerConfig::set_beta1},
             {"beta2", &proto::OptimizerConfig::set_beta2},
             {"epsilon", &proto::OptimizerConfig::set_epsilon}}) {
      std::string field = "optimizer." + name;
      (*m)[field] = [field, set = set](const YAML::Node& n, proto::ClusterConfig* c) -> absl::Status {
        absl::StatusOr<double> v = ParseDouble(n, field);
        if (!v.ok()) return v.status();
        (c->mutable_optimizer()->*set)(*v);
        return absl::OkStatus();
      };
    }
    (*m)["step_timeout_ms"] = U32("step_timeout_ms", &proto::ClusterConfig::set_step_timeout_ms);
    (*m)["replicas"] = U32("replicas", &proto::ClusterConfig::set_replicas);
    (*m)["rpc_timeout_ms"] = U32("rpc_timeout_ms", &proto::ClusterConfig::set_rpc_timeout_ms);
    (*m)["connect_timeout_ms"] =
        U32("connect_timeout_ms", &proto::ClusterConfig::set_connect_timeout_ms);
    (*m)["channels_per_shard"] =
        U32("channels_per_shard", &proto::ClusterConfig::set_channels_per_shard);
    (*m)["max_inflight_chunks"] =
        U32("max_inflight_chunks", &proto::ClusterConfig::set_max_inflight_chunks);
    (*m)["max_retries"] = U32("max_retries", &proto::ClusterConfig::set_max_retries);
    (*m)["retry_backoff_ms"] = U32("retry_backoff_ms", &proto::ClusterConfig::set_retry_backoff_ms);
    (*m)["max_message_bytes"] =
        U64("max_message_bytes", &proto::ClusterConfig::set_max_message_bytes);
    using P = proto::ClusterConfig;
    using Sec = proto::SecurityConfig;
    for (auto [name, set] : std::vector<std::pair<std::string, void (Sec::*)(const std::string&)>>{
             {"ca_file", &Sec::set_ca_file},
             {"cert_file", &Sec::set_cert_file},
             {"key_file", &Sec::set_key_file},
             {"token_file", &Sec::set_token_file}}) {
      (*m)["security." + name] = NestedString("security." + name, &P::mutable_security, set);
    }
    (*m)["security.health_port"] =
        NestedUnsigned("security.health_port", &P::mutable_security, &Sec::set_health_port);
    (*m)["security.cert_refresh_s"] =
        NestedUnsigned("security.cert_refresh_s", &P::mutable_security, &Sec::set_cert_refresh_s);
    using Lim = proto::LimitsConfig;
    (*m)["limits.memory_budget_bytes"] = NestedUnsigned(
        "limits.memory_budget_bytes", &P::mutable_limits, &Lim::set_memory_budget_bytes);
    (*m)["limits.max_tensors"] =
        NestedUnsigned("limits.max_tensors", &P::mutable_limits, &Lim::set_max_tensors);
    (*m)["limits.max_key_bytes"] =
        NestedUnsigned("limits.max_key_bytes", &P::mutable_limits, &Lim::set_max_key_bytes);
    (*m)["limits.max_pending_steps"] = NestedUnsigned(
        "limits.max_pending_steps", &P::mutable_limits, &Lim::set_max_pending_steps);
    (*m)["limits.max_pending_bytes"] = NestedUnsigned(
        "limits.max_pending_bytes", &P::mutable_limits, &Lim::set_max_pending_bytes);
    (*m)["limits.max_calls_per_client"] = NestedUnsigned(
        "limits.max_calls_per_client", &P::mutable_limits, &Lim::set_max_calls_per_client);
    using Ck = proto::CheckpointConfig;
    (*m)["checkpoint.dir"] = NestedString("checkpoint.dir", &P::mutable_checkpoint, &Ck::set_dir);
    (*m)["checkpoint.every_steps"] =
        NestedUnsigned("checkpoint.every_steps", &P::mutable_checkpoint, &Ck::set_every_steps);
    (*m)["checkpoint.keep"] =
        NestedUnsigned("checkpoint.keep", &P::mutable_checkpoint, &Ck::set_keep);
    return m;
  }();
  return *setters;
}

absl::Status ApplyNode(const YAML::Node& node, const std::string& prefix,
                       proto::ClusterConfig* config) {
  if (!node.IsMap()) {
    return FieldError(prefix.empty() ? "<root>" : prefix, "expected a mapping");
  }
  for (const auto& kv : node) {
    // A list or mapping as a key ("{[a]: 1}") is valid YAML; as<std::string>() would throw.
    if (!kv.first.IsScalar()) {
      return FieldError(prefix.empty() ? "<root>" : prefix,
                        "keys must be field names, not lists, mappings or null");
    }
    std::string key = kv.first.Scalar();
    std::string field = prefix.empty() ? key : prefix + "." + key;
    auto it = Setters().find(field);
    if (it != Setters().end()) {
      absl::Status s = it->second(kv.second, config);
      if (!s.ok()) return s;
      continue;
    }
    if ((field == "uplink" || field == "downlink" || field == "optimizer" ||
         field == "security" || field == "limits" || field == "checkpoint") &&
        kv.second.IsMap()) {
      absl::Status s = ApplyNode(kv.second, field, config);
      if (!s.ok()) return s;
      continue;
    }
    return FieldError(field, "unknown field");
  }
  return absl::OkStatus();
}

absl::Status ValidateCodec(const proto::CodecConfig& c, const std::string& dir) {
  if (c.mode() == "none") return absl::OkStatus();
  absl::StatusOr<codec::Mode> mode = codec::ParseMode(c.mode());
  if (!mode.ok()) {
    return FieldError(dir + ".mode", absl::StrCat("must be none, lossless or near-lossless, got '",
                                                  c.mode(), "'"));
  }
  if (c.rel_bits() < 0 || c.rel_bits() > 23) {
    return FieldError(dir + ".rel_bits", absl::StrCat("must be in [0, 23], got ", c.rel_bits()));
  }
  if (c.abs_log2() < -128 || c.abs_log2() > 0) {
    return FieldError(dir + ".abs_log2",
                      absl::StrCat("must be in [-128, 0], got ", c.abs_log2()));
  }
  return absl::OkStatus();
}

bool ValidAddress(absl::string_view a) {
  size_t colon = a.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  uint32_t port = 0;
  return absl::SimpleAtoi(a.substr(colon + 1), &port) && port >= 1 && port <= 65535;
}

void EmitCodec(YAML::Emitter& out, const char* name, const proto::CodecConfig& c) {
  out << YAML::Key << name << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "mode" << YAML::Value << c.mode();
  out << YAML::Key << "rel_bits" << YAML::Value << c.rel_bits();
  out << YAML::Key << "abs_log2" << YAML::Value << c.abs_log2();
  out << YAML::EndMap;
}

}  // namespace

proto::ClusterConfig DefaultClusterConfig() {
  proto::ClusterConfig c;
  c.set_job("default");
  c.set_workers(1);
  c.set_shard_map_epoch(1);
  c.set_chunk_bytes(1 << 20);
  for (proto::CodecConfig* d : {c.mutable_uplink(), c.mutable_downlink()}) {
    d->set_mode("near-lossless");
    d->set_rel_bits(7);
    d->set_abs_log2(-16);
  }
  proto::OptimizerConfig* o = c.mutable_optimizer();
  o->set_name("none");
  o->set_learning_rate(0.01);
  o->set_momentum(0.9);
  o->set_beta1(0.9);
  o->set_beta2(0.999);
  o->set_epsilon(1e-8);
  c.set_step_timeout_ms(10000);
  c.set_rpc_timeout_ms(30000);
  c.set_connect_timeout_ms(5000);
  c.set_channels_per_shard(2);
  c.set_max_inflight_chunks(8);
  c.set_max_retries(5);
  c.set_retry_backoff_ms(50);
  c.set_max_message_bytes(0);  // 0: derived from chunk_bytes
  c.set_replicas(1);
  c.mutable_security()->set_cert_refresh_s(60);
  proto::LimitsConfig* l = c.mutable_limits();
  l->set_memory_budget_bytes(0);  // 0: derived from the cgroup limit or physical memory
  l->set_max_tensors(16384);
  l->set_max_key_bytes(1024);
  l->set_max_pending_steps(65536);
  l->set_max_pending_bytes(0);  // 0: only the memory budget bounds them
  l->set_max_calls_per_client(1024);
  c.mutable_checkpoint()->set_keep(2);
  return c;
}

// Matches shards.count's range; a map this size is already far beyond any deployment, and a
// bound keeps a config from a network peer (a re-shard's Prepare) cheap to check.
constexpr int kMaxShards = 4096;
constexpr uint32_t kMaxReplicas = 8;

absl::Status ValidateClusterConfig(const proto::ClusterConfig& c) {
  if (c.job().empty()) return FieldError("job", "must not be empty");
  if (c.workers() < 1 || c.workers() > 4096) {
    return FieldError("workers", absl::StrCat("must be in [1, 4096], got ", c.workers()));
  }
  if (c.shards_size() < 1) return FieldError("shards", "must list at least one host:port");
  for (int i = 0; i < c.shards_size(); ++i) {
    if (!ValidAddress(c.shards(i))) {
      return FieldError(absl::StrCat("shards[", i, "]"),
                        absl::StrCat("expected host:port with port in [1, 65535], got '",
                                     c.shards(i), "'"));
    }
  }
  if (c.shards_size() > kMaxShards) {
    return FieldError("shards", absl::StrCat("at most ", kMaxShards, " shards, got ", c.shards_size()));
  }
  absl::flat_hash_map<absl::string_view, int> first_index;
  for (int i = 0; i < c.shards_size(); ++i) {
    auto [it, inserted] = first_index.emplace(c.shards(i), i);
    if (!inserted) {
      return FieldError(absl::StrCat("shards[", i, "]"),
                        absl::StrCat("'", c.shards(i), "' is listed twice (also shards[", it->second, "])"));
    }
  }
  if (c.shard_map_epoch() < 1) return FieldError("shard_map_epoch", "must be at least 1");
  if (c.chunk_bytes() < 4 || c.chunk_bytes() > (uint64_t{1} << 28)) {
    return FieldError("chunk_bytes",
                      absl::StrCat("must be in [4, 268435456], got ", c.chunk_bytes()));
  }
  absl::Status s = ValidateCodec(c.uplink(), "uplink");
  if (!s.ok()) return s;
  s = ValidateCodec(c.downlink(), "downlink");
  if (!s.ok()) return s;
  const proto::OptimizerConfig& o = c.optimizer();
  if (o.name() != "none" && o.name() != "sgd" && o.name() != "momentum" && o.name() != "adam") {
    return FieldError("optimizer.name",
                      absl::StrCat("must be none, sgd, momentum or adam, got '", o.name(), "'"));
  }
  if (!(o.learning_rate() > 0)) {
    return FieldError("optimizer.learning_rate", absl::StrCat("must be > 0, got ", o.learning_rate()));
  }
  if (!(o.momentum() >= 0 && o.momentum() < 1)) {
    return FieldError("optimizer.momentum", absl::StrCat("must be in [0, 1), got ", o.momentum()));
  }
  if (!(o.beta1() >= 0 && o.beta1() < 1)) {
    return FieldError("optimizer.beta1", absl::StrCat("must be in [0, 1), got ", o.beta1()));
  }
  if (!(o.beta2() >= 0 && o.beta2() < 1)) {
    return FieldError("optimizer.beta2", absl::StrCat("must be in [0, 1), got ", o.beta2()));
  }
  if (!(o.epsilon() > 0)) {
    return FieldError("optimizer.epsilon", absl::StrCat("must be > 0, got ", o.epsilon()));
  }
  if (c.step_timeout_ms() < 1) return FieldError("step_timeout_ms", "must be at least 1");
  if (c.rpc_timeout_ms() <= c.step_timeout_ms()) {
    return FieldError("rpc_timeout_ms",
                      absl::StrCat("must exceed step_timeout_ms (", c.step_timeout_ms(),
                                   ") so that a failed step's status reaches the worker, got ",
                                   c.rpc_timeout_ms()));
  }
  if (c.connect_timeout_ms() < 1) return FieldError("connect_timeout_ms", "must be at least 1");
  if (c.channels_per_shard() < 1 || c.channels_per_shard() > 64) {
    return FieldError("channels_per_shard",
                      absl::StrCat("must be in [1, 64], got ", c.channels_per_shard()));
  }
  if (c.max_inflight_chunks() < 1 || c.max_inflight_chunks() > 1024) {
    return FieldError("max_inflight_chunks",
                      absl::StrCat("must be in [1, 1024], got ", c.max_inflight_chunks()));
  }
  if (c.max_retries() > 100) {
    return FieldError("max_retries", absl::StrCat("must be at most 100, got ", c.max_retries()));
  }
  if (c.retry_backoff_ms() < 1 || c.retry_backoff_ms() > 60000) {
    return FieldError("retry_backoff_ms",
                      absl::StrCat("must be in [1, 60000], got ", c.retry_backoff_ms()));
  }
  if (c.max_message_bytes() != 0 && c.max_message_bytes() < 2 * c.chunk_bytes() + 4096) {
    return FieldError("max_message_bytes",
                      absl::StrCat("must be 0 (derived) or at least 2 * chunk_bytes + 4096 = ",
                                   2 * c.chunk_bytes() + 4096, ", got ", c.max_message_bytes()));
  }
  if (c.max_message_bytes() > (uint64_t{1} << 31) - 1) {
    return FieldError("max_message_bytes", "must be below 2 GiB");
  }
  const proto::SecurityConfig& sec = c.security();
  const int tls_files =
      !sec.ca_file().empty() + !sec.cert_file().empty() + !sec.key_file().empty();
  if (tls_files != 0 && tls_files != 3) {
    return FieldError(sec.ca_file().empty()     ? "security.ca_file"
                      : sec.cert_file().empty() ? "security.cert_file"
                                                : "security.key_file",
                      "mutual TLS needs ca_file, cert_file and key_file together (or none)");
  }
  if (sec.health_port() > 65535) {
    return FieldError("security.health_port",
                      absl::StrCat("must be a port in [0, 65535], got ", sec.health_port()));
  }
  if (sec.health_port() != 0 && tls_files == 0) {
    return FieldError("security.health_port",
                      "only used with TLS on (without TLS, health is served on the shard port)");
  }
  if (sec.cert_refresh_s() < 1 || sec.cert_refresh_s() > 86400) {
    return FieldError("security.cert_refresh_s",
                      absl::StrCat("must be in [1, 86400], got ", sec.cert_refresh_s()));
  }
  const proto::LimitsConfig& l = c.limits();
  if (l.memory_budget_bytes() != 0 && l.memory_budget_bytes() < (uint64_t{1} << 20)) {
    return FieldError("limits.memory_budget_bytes",
                      absl::StrCat("must be 0 (derived) or at least 1 MiB, got ",
                                   l.memory_budget_bytes()));
  }
  if (l.max_tensors() < 1) return FieldError("limits.max_tensors", "must be at least 1");
  if (l.max_key_bytes() < 1 || l.max_key_bytes() > 65536) {
    return FieldError("limits.max_key_bytes",
                      absl::StrCat("must be in [1, 65536], got ", l.max_key_bytes()));
  }
  if (l.max_pending_steps() < 1) {
    return FieldError("limits.max_pending_steps", "must be at least 1");
  }
  if (l.max_calls_per_client() < 1 || l.max_calls_per_client() > 65536) {
    return FieldError("limits.max_calls_per_client",
                      absl::StrCat("must be in [1, 65536], got ", l.max_calls_per_client()));
  }
  if (c.replicas() > static_cast<uint32_t>(c.shards_size()) || c.replicas() > kMaxReplicas) {
    return FieldError("replicas", absl::StrCat("must be in [1, min(", kMaxReplicas,
                                               ", the number of shards = ", c.shards_size(),
                                               ")], got ", c.replicas()));
  }
  std::vector<bool> down(c.shards_size(), false);
  for (int i = 0; i < c.down_shards_size(); ++i) {
    const uint32_t k = c.down_shards(i);
    if (k >= static_cast<uint32_t>(c.shards_size()) || down[k]) {
      return FieldError(absl::StrCat("down_shards[", i, "]"),
                        absl::StrCat(k, " is not a shard index, or listed twice"));
    }
    down[k] = true;
  }
  for (int i = 0; i < c.joining_shards_size(); ++i) {
    const uint32_t k = c.joining_shards(i);
    if (k >= static_cast<uint32_t>(c.shards_size()) || down[k]) {
      return FieldError(absl::StrCat("joining_shards[", i, "]"),
                        absl::StrCat(k, " is not a shard index, or is listed twice or down"));
    }
    down[k] = true;  // from here on: seen
  }
  if ((c.down_shards_size() > 0 || c.joining_shards_size() > 0) && Replicas(c) < 2) {
    return FieldError("down_shards", "only a map with replicas >= 2 fails shards over");
  }
  const proto::CheckpointConfig& ck = c.checkpoint();
  if (ck.keep() < 1 || ck.keep() > 1000) {
    return FieldError("checkpoint.keep", absl::StrCat("must be in [1, 1000], got ", ck.keep()));
  }
  if (ck.every_steps() != 0 && ck.dir().empty()) {
    return FieldError("checkpoint.every_steps", "set without checkpoint.dir");
  }
  return absl::OkStatus();
}

absl::StatusOr<proto::ClusterConfig> ParseClusterConfig(
    absl::string_view text, const std::vector<std::string>& overrides) {
  proto::ClusterConfig config = DefaultClusterConfig();
  YAML::Node root;
  try {  // yaml-cpp reports syntax errors only by exception; they stop here.
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cluster config: not YAML/JSON: ", e.what()));
  }
  if (root.IsDefined() && !root.IsNull()) {
    absl::Status s = ApplyNode(root, "", &config);
    if (!s.ok()) return s;
  }
  for (const std::string& o : overrides) {
    size_t eq = o.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster config override '", o, "': expected field=value"));
    }
    std::string field = o.substr(0, eq);
    auto it = Setters().find(field);
    if (it == Setters().end()) return FieldError(field, "unknown field");
    absl::Status s = it->second(YAML::Node(o.substr(eq + 1)), &config);
    if (!s.ok()) return s;
  }
  absl::Status s = ValidateClusterConfig(config);
  if (!s.ok()) return s;
  if (config.max_message_bytes() == 0) {
    config.set_max_message_bytes(2 * config.chunk_bytes() + (1 << 20));
  }
  return config;
}

absl::StatusOr<proto::ClusterConfig> LoadClusterConfig(const std::string& path,
                                                       const std::vector<std::string>& overrides) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read cluster config '", path, "'"));
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseClusterConfig(ss.str(), overrides);
}

std::string ClusterConfigToYaml(const proto::ClusterConfig& c) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "job" << YAML::Value << c.job();
  out << YAML::Key << "workers" << YAML::Value << c.workers();
  out << YAML::Key << "shards" << YAML::Value << YAML::BeginSeq;
  for (const std::string& s : c.shards()) out << s;
  out << YAML::EndSeq;
  out << YAML::Key << "shard_map_epoch" << YAML::Value << c.shard_map_epoch();
  out << YAML::Key << "chunk_bytes" << YAML::Value << c.chunk_bytes();
  out << YAML::Key << "replicas" << YAML::Value << c.replicas();  // as given: 0 reads as 1
  EmitCodec(out, "uplink", c.uplink());
  EmitCodec(out, "downlink", c.downlink());
  const proto::OptimizerConfig& o = c.optimizer();
  out << YAML::Key << "optimizer" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << o.name();
  out << YAML::Key << "learning_rate" << YAML::Value << YAML::Precision(17) << o.learning_rate();
  out << YAML::Key << "momentum" << YAML::Value << o.momentum();
  out << YAML::Key << "beta1" << YAML::Value << o.beta1();
  out << YAML::Key << "beta2" << YAML::Value << o.beta2();
  out << YAML::Key << "epsilon" << YAML::Value << o.epsilon();
  out << YAML::EndMap;
  out << YAML::Key << "step_timeout_ms" << YAML::Value << c.step_timeout_ms();
  out << YAML::Key << "rpc_timeout_ms" << YAML::Value << c.rpc_timeout_ms();
  out << YAML::Key << "connect_timeout_ms" << YAML::Value << c.connect_timeout_ms();
  out << YAML::Key << "channels_per_shard" << YAML::Value << c.channels_per_shard();
  out << YAML::Key << "max_inflight_chunks" << YAML::Value << c.max_inflight_chunks();
  out << YAML::Key << "max_retries" << YAML::Value << c.max_retries();
  out << YAML::Key << "retry_backoff_ms" << YAML::Value << c.retry_backoff_ms();
  out << YAML::Key << "max_message_bytes" << YAML::Value << c.max_message_bytes();
  const proto::SecurityConfig& sec = c.security();
  out << YAML::Key << "security" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "ca_file" << YAML::Value << sec.ca_file();
  out << YAML::Key << "cert_file" << YAML::Value << sec.cert_file();
  out << YAML::Key << "key_file" << YAML::Value << sec.key_file();
  out << YAML::Key << "token_file" << YAML::Value << sec.token_file();
  out << YAML::Key << "health_port" << YAML::Value << sec.health_port();
  out << YAML::Key << "cert_refresh_s" << YAML::Value << sec.cert_refresh_s();
  out << YAML::EndMap;
  const proto::LimitsConfig& l = c.limits();
  out << YAML::Key << "limits" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "memory_budget_bytes" << YAML::Value << l.memory_budget_bytes();
  out << YAML::Key << "max_tensors" << YAML::Value << l.max_tensors();
  out << YAML::Key << "max_key_bytes" << YAML::Value << l.max_key_bytes();
  out << YAML::Key << "max_pending_steps" << YAML::Value << l.max_pending_steps();
  out << YAML::Key << "max_pending_bytes" << YAML::Value << l.max_pending_bytes();
  out << YAML::Key << "max_calls_per_client" << YAML::Value << l.max_calls_per_client();
  out << YAML::EndMap;
  const proto::CheckpointConfig& ck = c.checkpoint();
  out << YAML::Key << "checkpoint" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "dir" << YAML::Value << ck.dir();
  out << YAML::Key << "every_steps" << YAML::Value << ck.every_steps();
  out << YAML::Key << "keep" << YAML::Value << ck.keep();
  out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

absl::Status ValidateReshard(const proto::ClusterConfig& from, const proto::ClusterConfig& to) {
  if (absl::Status s = ValidateClusterConfig(to); !s.ok()) return s;
  if (to.shard_map_epoch() <= from.shard_map_epoch()) {
    return FieldError("shard_map_epoch",
                      absl::StrCat("a re-shard must raise it above the running epoch ",
                                   from.shard_map_epoch(), ", got ", to.shard_map_epoch()));
  }
  // Everything but the map must stay: workers, chunking, codecs and optimizers are part of
  // every chunk's state and every worker's view.
  proto::ClusterConfig a = from, b = to;
  if ((from.down_shards_size() > 0 || from.joining_shards_size() > 0) &&
      from.shards_size() != to.shards_size()) {
    return FieldError("shards", absl::StrCat("cannot re-shard while shard ", from.down_shards(0),
                                             " is down (failed over); bring it back first"));
  }
  for (proto::ClusterConfig* c : {&a, &b}) {
    c->clear_shards();
    c->clear_shard_map_epoch();
    c->clear_down_shards();
    c->clear_joining_shards();
  }
  google::protobuf::util::MessageDifferencer differ;
  std::string diff;
  differ.ReportDifferencesToString(&diff);
  if (!differ.Compare(a, b)) {
    const std::string first = diff.substr(0, diff.find('\n'));
    return absl::InvalidArgumentError(absl::StrCat(
        "a re-shard may change only `shards` and `shard_map_epoch`; the new config differs in ",
        first));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ShardFromPodName(absl::string_view name) {
  const size_t dash = name.rfind('-');
  uint32_t index = 0;
  if (dash == absl::string_view::npos || dash + 1 == name.size() ||
      name.find_first_not_of("0123456789", dash + 1) != absl::string_view::npos ||
      !absl::SimpleAtoi(name.substr(dash + 1), &index)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host name '", name, "' does not end in -<number> (a StatefulSet pod's ordinal); "
        "pass --shard instead"));
  }
  return index;
}

}  // namespace gcomp::cluster
