#include "cluster/cluster_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/files.h"
#include "cluster/config_fields.h"
#include "cluster/optimizer.h"
#include "google/protobuf/util/message_differencer.h"
#include "yaml-cpp/yaml.h"

namespace gcomp::cluster {
namespace {

using config_fields::FieldError;

absl::Status ApplyNode(const YAML::Node& node, const std::string& prefix,
                       proto::ClusterConfig* config) {
  if (!node.IsMap()) {
    return FieldError(prefix.empty() ? "<root>" : prefix, "expected a mapping");
  }
  absl::flat_hash_set<std::string> seen;
  for (const auto& kv : node) {
    // A list or mapping as a key ("{[a]: 1}") is valid YAML; as<std::string>() would throw.
    if (!kv.first.IsScalar()) {
      return FieldError(prefix.empty() ? "<root>" : prefix,
                        "keys must be field names, not lists, mappings or null");
    }
    std::string key = kv.first.Scalar();
    std::string field = prefix.empty() ? key : prefix + "." + key;
    // yaml-cpp keeps repeated keys; one silently overriding the other hides a mistake.
    if (!seen.insert(key).second) return FieldError(field, "given twice");
    if (const config_fields::Field* f = config_fields::Find(field)) {
      absl::Status s = config_fields::Set(*f, kv.second, config);
      if (!s.ok()) return s;
      continue;
    }
    if (config_fields::IsGroup(field) && kv.second.IsMap()) {
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
  codec::Policy policy;
  policy.mode = *mode;
  policy.rel_bits = c.rel_bits();
  policy.abs_log2 = c.abs_log2();
  if (std::optional<codec::PolicyRangeError> e = codec::CheckPolicyRanges(policy)) {
    return FieldError(absl::StrCat(dir, ".", e->field), e->rule);
  }
  return absl::OkStatus();
}

bool ValidAddress(absl::string_view a) {
  size_t colon = a.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  // Digits only, no sign or leading zero: "+47101" and "047101" would name the same port as
  // "47101" and pass the duplicate check below as different strings.
  const absl::string_view digits = a.substr(colon + 1);
  if (digits.empty() || digits[0] == '0' ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return false;
  }
  uint32_t port = 0;
  return absl::SimpleAtoi(digits, &port) && port >= 1 && port <= 65535;
}

// The form of a valid address under which two spellings of one endpoint compare equal:
// host names are case-insensitive, and localhost is 127.0.0.1 (what the resolver gives it
// first). IPv6 loopback stays apart (a shard may listen on ::1 beside another on
// 127.0.0.1), and so does a name with a trailing dot (search domains may expand the other).
std::string EndpointKey(absl::string_view address) {
  const size_t colon = address.rfind(':');
  std::string host = absl::AsciiStrToLower(address.substr(0, colon));
  if (host == "localhost") host = "127.0.0.1";
  return absl::StrCat(host, address.substr(colon));
}

}  // namespace

proto::ClusterConfig DefaultClusterConfig() { return config_fields::Defaults(); }

// Matches shards.count's range; a map this size is already far beyond any deployment, and a
// bound keeps a config from a network peer (a re-shard's Prepare) cheap to check.
constexpr uint32_t kMaxReplicas = 8;

std::string JobCheckpointDir(const proto::ClusterConfig& c) {
  if (c.checkpoint().dir().empty()) return "";
  // The job may be any UTF-8 text; as one path component, every byte but [A-Za-z0-9_-]
  // (and '.' after the first) is %XX, so "a/b" or ".." stay one directory of the root.
  std::string name;
  for (size_t i = 0; i < c.job().size(); ++i) {
    const unsigned char b = static_cast<unsigned char>(c.job()[i]);
    if (absl::ascii_isalnum(b) || b == '_' || b == '-' || (b == '.' && i > 0)) {
      name.push_back(static_cast<char>(b));
    } else {
      absl::StrAppend(&name, absl::StrFormat("%%%02X", b));
    }
  }
  return absl::StrCat(absl::StripSuffix(c.checkpoint().dir(), "/"), "/", name);
}

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
  absl::flat_hash_map<std::string, int> first_index;
  for (int i = 0; i < c.shards_size(); ++i) {
    auto [it, inserted] = first_index.emplace(EndpointKey(c.shards(i)), i);
    if (inserted) continue;
    const std::string& first = c.shards(it->second);
    return FieldError(
        absl::StrCat("shards[", i, "]"),
        first == c.shards(i)
            ? absl::StrCat("'", first, "' is listed twice (also shards[", it->second, "])")
            : absl::StrCat("'", c.shards(i), "' names the same endpoint as shards[", it->second,
                           "] ('", first, "'): listed twice"));
  }
  // Failovers and re-shards count it up by one: far below the top, it can never wrap.
  if (c.shard_map_epoch() < 1 || c.shard_map_epoch() >= (uint64_t{1} << 62)) {
    return FieldError("shard_map_epoch", "must be at least 1 and below 2^62");
  }
  if (c.chunk_bytes() < 4 || c.chunk_bytes() > (uint64_t{1} << 28)) {
    return FieldError("chunk_bytes",
                      absl::StrCat("must be in [4, 268435456], got ", c.chunk_bytes()));
  }
  absl::Status s = ValidateCodec(c.uplink(), "uplink");
  if (!s.ok()) return s;
  s = ValidateCodec(c.downlink(), "downlink");
  if (!s.ok()) return s;
  const proto::OptimizerConfig& o = c.optimizer();
  if (!ParseOptimizerKind(o.name()).ok()) {
    return FieldError("optimizer.name",
                      absl::StrCat("must be none, sgd, momentum or adam, got '", o.name(), "'"));
  }
  OptimizerOptions options;
  options.learning_rate = o.learning_rate();
  options.momentum = o.momentum();
  options.beta1 = o.beta1();
  options.beta2 = o.beta2();
  options.epsilon = o.epsilon();
  if (std::optional<OptimizerOptionError> e = CheckOptimizerOptions(options)) {
    return FieldError(absl::StrCat("optimizer.", e->option), e->rule);
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
  // Every worker keeps channels_per_shard connections to each shard, and a few more
  // (peers, the admin tool, probes) come and go.
  const uint64_t worker_connections = uint64_t{c.workers()} * c.channels_per_shard() + 16;
  if (l.max_connections() != 0 &&
      (l.max_connections() < worker_connections || l.max_connections() > (1u << 24))) {
    return FieldError(
        "limits.max_connections",
        absl::StrCat("must be 0 (derived) or in [workers x channels_per_shard + 16 = ",
                     worker_connections, ", 2^24], got ", l.max_connections()));
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
  const proto::CoordinationConfig& co = c.coordination();
  for (int i = 0; i < co.etcd_size(); ++i) {
    if (!ValidAddress(co.etcd(i))) {
      return FieldError(absl::StrCat("coordination.etcd[", i, "]"),
                        absl::StrCat("expected host:port of an etcd member's client URL, got '",
                                     co.etcd(i), "'"));
    }
  }
  if (co.lease_ttl_ms() < 1000 || co.lease_ttl_ms() > 600000) {
    return FieldError("coordination.lease_ttl_ms",
                      absl::StrCat("must be in [1000, 600000], got ", co.lease_ttl_ms()));
  }
  if (co.request_timeout_ms() < 50 || co.request_timeout_ms() > co.lease_ttl_ms() / 3) {
    return FieldError("coordination.request_timeout_ms",
                      absl::StrCat("must be in [50, lease_ttl_ms / 3 = ", co.lease_ttl_ms() / 3,
                                   "] (a lease is renewed every third of its ttl), got ",
                                   co.request_timeout_ms()));
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
    const config_fields::Field* f = config_fields::Find(field);
    if (f == nullptr) return FieldError(field, "unknown field");
    absl::Status s = config_fields::Set(*f, YAML::Node(o.substr(eq + 1)), &config);
    if (!s.ok()) return s;
  }
  absl::Status s = ValidateClusterConfig(config);
  if (!s.ok()) return s;
  if (config.max_message_bytes() == 0) {
    config.set_max_message_bytes(2 * config.chunk_bytes() + (1 << 20));
  }
  return config;
}

absl::StatusOr<proto::ClusterConfig> ScaledClusterConfig(absl::string_view text, uint32_t count,
                                                         const std::vector<std::string>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("cluster config: not YAML/JSON: ", e.what()));
  }
  if (!root.IsMap() || !root["shards"].IsMap() || !root["shards"]["address"]) {
    return FieldError("shards", "scaling needs the form {count: N, address: \"...{index}...\"} "
                                "(a list of addresses cannot be extended; give the new list to "
                                "gcomp_admin reshard)");
  }
  root["shards"]["count"] = count;
  YAML::Emitter out;
  out << root;
  return ParseClusterConfig(out.c_str(), overrides);
}

absl::StatusOr<proto::ClusterConfig> LoadClusterConfig(const std::string& path,
                                                       const std::vector<std::string>& overrides) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster config '", path, "' is a directory, not a file"));
  }
  absl::StatusOr<std::string> text = ReadFile(path, kMaxClusterConfigBytes);
  if (absl::IsFailedPrecondition(text.status())) {  // /dev/zero, or not a config at all
    return absl::InvalidArgumentError(
        absl::StrCat("cluster config '", path, "': ", text.status().message()));
  }
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat("cannot read cluster config '", path, "'"));
  }
  // Overrides here come from a person (--set flags): as with a key given twice in the file,
  // one value silently replacing the other would hide a mistake.
  absl::flat_hash_map<std::string, std::string> given;
  for (const std::string& o : overrides) {
    const std::string field = o.substr(0, o.find('='));
    if (auto [it, fresh] = given.emplace(field, o); !fresh) {
      return FieldError(
          field, absl::StrCat("given twice in the overrides ('", it->second, "', then '", o, "')"));
    }
  }
  return ParseClusterConfig(*text, overrides);
}

std::string ClusterConfigToYaml(const proto::ClusterConfig& c) {
  YAML::Emitter out;
  config_fields::Emit(c, out);
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
