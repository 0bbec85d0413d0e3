#include "admin/status.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/json.h"
#include "cluster/cluster_config.h"
#include "cluster/credentials.h"
#include "cluster/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "proto/aggregation.grpc.pb.h"

namespace gcomp::admin {
namespace {

// Raw over wire bytes in both directions; 0 when nothing went over the wire.
double Ratio(const proto::StatsResponse& s) {
  const uint64_t wire = s.bytes_in() + s.bytes_out();
  if (wire == 0) return 0;
  return double(s.raw_bytes_in() + s.raw_bytes_out()) / double(wire);
}

// A table cell: a shard's last error holds text a peer chose (a key, a job), so newlines,
// tabs and terminal commands are escaped (they would break the alignment or act on the
// terminal).
std::string OneLine(absl::string_view s) { return EscapeForText(s); }

std::string ErrorCell(const absl::Status& s) {
  return OneLine(absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message()));
}

}  // namespace

bool ClusterStatus::all_up() const {
  return std::all_of(shards.begin(), shards.end(), [](const ShardStatus& s) { return s.up(); });
}

absl::StatusOr<ClusterStatus> CollectStatus(const proto::ClusterConfig& config,
                                            const StatusOptions& options) {
  absl::Status valid = cluster::ValidateClusterConfig(config);
  if (!valid.ok()) return valid;
  // A day at most: larger values would overflow the deadline's clock arithmetic.
  constexpr int64_t kMaxTimeoutMs = int64_t{24} * 3600 * 1000;
  if (options.timeout_ms <= 0 || options.timeout_ms > kMaxTimeoutMs) {
    return absl::InvalidArgumentError(
        absl::StrCat("timeout_ms must be 1 to ", kMaxTimeoutMs, ", got ", options.timeout_ms));
  }
  absl::StatusOr<cluster::ClientSecurity> security = cluster::MakeClientSecurity(config);
  if (!security.ok()) return security.status();

  // One async call per shard on one completion queue: every shard gets the full deadline,
  // and a thousand shards need no thousand threads.
  struct Call {
    std::unique_ptr<proto::Aggregation::Stub> stub;
    grpc::ClientContext context;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<proto::StatsResponse>> reader;
  };
  const int n = config.shards_size();
  ClusterStatus result;
  result.shards.resize(n);
  std::vector<std::unique_ptr<Call>> calls(n);
  grpc::CompletionQueue cq;
  const auto deadline =
      std::chrono::system_clock::now() + std::chrono::milliseconds(options.timeout_ms);
  for (int i = 0; i < n; ++i) {
    ShardStatus& row = result.shards[i];
    row.shard = static_cast<uint32_t>(i);
    row.address = config.shards(i);
    row.error = absl::UnknownError("no answer");  // until the call completes
    auto call = std::make_unique<Call>();
    call->stub = proto::Aggregation::NewStub(security->NewChannel(row.address));
    call->context.set_deadline(deadline);
    call->reader = call->stub->AsyncStats(&call->context, proto::StatsRequest(), &cq);
    call->reader->Finish(&row.stats, &call->status, reinterpret_cast<void*>(intptr_t{i}));
    calls[i] = std::move(call);
  }
  for (int done = 0; done < n; ++done) {
    void* tag = nullptr;
    bool ok = false;
    if (!cq.Next(&tag, &ok)) break;  // not before Shutdown: every call completes
    const int i = static_cast<int>(reinterpret_cast<intptr_t>(tag));
    ShardStatus& row = result.shards[i];
    const grpc::Status& s = calls[i]->status;
    row.error = absl::OkStatus();
    if (!s.ok()) {
      row.error = cluster::FromGrpc(s);
    } else if (row.stats.shard() != row.shard) {
      row.error = absl::FailedPreconditionError(
          absl::StrCat("the process at ", row.address, " is shard ", row.stats.shard(),
                       ", but the config lists it as shard ", row.shard));
    }
  }
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return result;
}

std::string HumanBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  double v = double(bytes) / 1024;
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  return absl::StrFormat("%.1f %s", v, kUnits[unit]);
}

std::string FormatStatusTable(const ClusterStatus& status) {
  std::vector<std::vector<std::string>> rows = {{"shard", "address", "state", "epoch", "chunks",
                                                 "tensors", "steps", "failed", "in", "out",
                                                 "ratio", "memory", "last error"}};
  for (const ShardStatus& s : status.shards) {
    std::vector<std::string> row = {absl::StrCat(s.shard), s.address};
    if (!s.up()) {
      row.push_back("DOWN");
      for (int k = 0; k < 9; ++k) row.push_back("-");
      row.push_back(ErrorCell(s.error));
    } else {
      const proto::StatsResponse& t = s.stats;
      const double ratio = Ratio(t);
      row.insert(row.end(),
                 {t.replication_degraded() ? "degraded" : "up", absl::StrCat(t.shard_map_epoch()),
                  absl::StrCat(t.chunks_owned()),
                  absl::StrCat(t.tensors()), absl::StrCat(t.steps_completed()),
                  absl::StrCat(t.steps_failed()), HumanBytes(t.bytes_in()),
                  HumanBytes(t.bytes_out()),
                  ratio > 0 ? absl::StrFormat("%.2fx", ratio) : std::string("-"),
                  absl::StrCat(HumanBytes(t.memory_used_bytes()), "/",
                               HumanBytes(t.memory_budget_bytes())),
                  t.last_error().empty() ? std::string("-") : OneLine(t.last_error())});
    }
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  // Numbers right-aligned, text left-aligned; the last column is not padded.
  static constexpr bool kRight[] = {true,  false, false, true,  true, true, true,
                                    true,  true,  true,  true,  true, false};
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      const size_t pad = width[c] - row[c].size();
      if (kRight[c]) line.append(pad, ' ');
      line += row[c];
      if (!kRight[c] && c + 1 < row.size()) line.append(pad, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string FormatStatusJson(const ClusterStatus& status) {
  std::vector<std::string> shards;
  for (const ShardStatus& s : status.shards) {
    std::string o = absl::StrCat("{\"shard\":", s.shard, ",\"address\":", JsonQuote(s.address),
                                 ",\"up\":", s.up() ? "true" : "false");
    if (!s.up()) {
      absl::StrAppend(&o, ",\"error_code\":", JsonQuote(absl::StatusCodeToString(s.error.code())),
                      ",\"error\":", JsonQuote(s.error.message()), "}");
      shards.push_back(std::move(o));
      continue;
    }
    const proto::StatsResponse& t = s.stats;
    absl::StrAppend(&o, ",\"shard_map_epoch\":", t.shard_map_epoch(),
                    ",\"chunks_owned\":", t.chunks_owned(), ",\"tensors\":", t.tensors(),
                    ",\"steps_completed\":", t.steps_completed(),
                    ",\"steps_failed\":", t.steps_failed(), ",\"pushes\":", t.pushes(),
                    ",\"duplicate_pushes\":", t.duplicate_pushes(),
                    ",\"rejected_pushes\":", t.rejected_pushes());
    absl::StrAppend(&o, ",\"bytes_in\":", t.bytes_in(), ",\"bytes_out\":", t.bytes_out(),
                    ",\"raw_bytes_in\":", t.raw_bytes_in(),
                    ",\"raw_bytes_out\":", t.raw_bytes_out(),
                    absl::StrFormat(",\"ratio\":%.4f", Ratio(t)));
    absl::StrAppend(&o, ",\"memory_used_bytes\":", t.memory_used_bytes(),
                    ",\"memory_budget_bytes\":", t.memory_budget_bytes(),
                    ",\"pending_steps\":", t.pending_steps(),
                    ",\"pending_bytes\":", t.pending_bytes(),
                    ",\"refused_by_limits\":", t.refused_by_limits(),
                    ",\"uptime_ms\":", t.uptime_ms(),
                    ",\"down_shards\":[", absl::StrJoin(t.down_shards(), ","), "]",
                    ",\"replication_degraded\":", t.replication_degraded() ? "true" : "false",
                    ",\"last_error\":", JsonQuote(t.last_error()), "}");
    shards.push_back(std::move(o));
  }
  return absl::StrCat("{\"shards\":[", absl::StrJoin(shards, ","),
                      "],\"all_up\":", status.all_up() ? "true" : "false", "}\n");
}

}  // namespace gcomp::admin
