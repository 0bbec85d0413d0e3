// Fuzz target: every request handler of server::ShardService, fed by a hostile client.
//
// The input is a serialized FuzzSession (fuzz_session.proto): a small cluster and a list of
// RegisterWorker / DeclareTensor / PushPull / Pull / Stats calls, the re-sharding ones
// (Prepare, Commit, Abort, Transfer, ReshardStatus) and the failover ones (Replicate,
// ReportDown, InstallMap, Rejoin; peers are unreachable), run in order against a fresh shard (so
// that a crash reproduces from its input alone; a committed re-shard switches on a thread
// of its own, the one source of nondeterminism). Every call runs with a deadline already
// due: a push that completes the step returns at once, one that waits for another worker
// or a re-shard returns DeadlineExceeded or Unavailable, so no input sleeps. Properties: every
// status is one of the codes shard_service.h documents; every block the shard answers with
// decodes as the chunk it names; Stats counts what was accepted.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/logging.h"
#include "cluster/cluster_config.h"
#include "cluster/wire_block.h"
#include "fuzz/fuzz_session.pb.h"
#include "fuzz/fuzz_support.h"
#include "server/shard_service.h"

namespace gcomp::fuzz {
namespace {

// Declarations above this many elements are not made (the shard would legitimately
// allocate for them); those beyond the shard's own limit (2^36) still are, to be refused.
constexpr uint64_t kMaxDeclaredElements = 4096;
constexpr uint64_t kShardElementLimit = uint64_t{1} << 36;

const std::initializer_list<absl::StatusCode> kShardErrors = {
    absl::StatusCode::kNotFound,           absl::StatusCode::kFailedPrecondition,
    absl::StatusCode::kInvalidArgument,    absl::StatusCode::kResourceExhausted,
    absl::StatusCode::kDataLoss,           absl::StatusCode::kDeadlineExceeded,
    absl::StatusCode::kAlreadyExists,      absl::StatusCode::kUnavailable,
    absl::StatusCode::kAborted};

proto::ClusterConfig SessionConfig(const FuzzSession& session) {
  proto::ClusterConfig config = cluster::DefaultClusterConfig();
  config.set_job("fuzz");
  config.set_workers(1 + session.workers() % 2);
  for (uint32_t s = 0; s < 1 + session.shards() % 2; ++s) {
    config.add_shards(absl::StrCat("127.0.0.1:", 7000 + s));
  }
  config.set_shard_map_epoch(1);
  // Small chunks: a 4096-element tensor has a few dozen of them at most.
  config.set_chunk_bytes(1024);
  static const char* const kModes[] = {"none", "lossless", "near-lossless"};
  config.mutable_downlink()->set_mode(kModes[session.downlink() % 3]);
  config.set_step_timeout_ms(1000);
  config.set_rpc_timeout_ms(2000);
  config.mutable_limits()->set_memory_budget_bytes(uint64_t{64} << 20);
  config.set_replicas(std::min<uint32_t>(1 + session.replicas() % 2, config.shards_size()));
  return config;
}

// A block the shard answered with must be a valid block of the chunk it names.
void CheckReply(const proto::CompressedBlock& reply, absl::string_view call) {
  absl::StatusOr<codec::DType> dtype = cluster::FromProto(reply.dtype());
  Check(dtype.ok(), absl::StrCat(call, " answered a block of unknown dtype"));
  Check(reply.elements() >= 1 && reply.elements() <= kMaxDeclaredElements,
        absl::StrCat(call, " answered a block of ", reply.elements(), " elements"));
  std::vector<uint8_t> out(reply.elements() * codec::DTypeBytes(*dtype));
  absl::Status s = cluster::DecodeWireBlock(reply, *dtype, reply.elements(), out.data());
  Check(s.ok(), absl::StrCat(call, " answered a block that does not decode: ", s.ToString()));
}

void RunSession(const FuzzSession& session) {
  absl::StatusOr<std::unique_ptr<server::ShardService>> shard =
      server::ShardService::Create(SessionConfig(session), server::ShardOptions{0, 1, {}});
  Check(shard.ok(), absl::StrCat("ShardService::Create: ", shard.status().ToString()));
  server::ShardService& service = **shard;
  uint64_t accepted_pushes = 0;
  for (const FuzzCall& call : session.calls()) {
    switch (call.call_case()) {
      case FuzzCall::kRegisterWorker: {
        proto::RegisterWorkerResponse response;
        absl::Status s = service.RegisterWorker(call.register_worker(), &response, absl::Now());
        if (!s.ok()) CheckCode(s, kShardErrors, "RegisterWorker");
        break;
      }
      case FuzzCall::kDeclareTensor: {
        const uint64_t n = call.declare_tensor().elements();
        if (n > kMaxDeclaredElements && n <= kShardElementLimit) break;
        proto::DeclareTensorResponse response;
        absl::Status s = service.DeclareTensor(call.declare_tensor(), &response, absl::Now());
        if (!s.ok()) CheckCode(s, kShardErrors, "DeclareTensor");
        break;
      }
      case FuzzCall::kPushPull: {
        proto::CompressedBlock response;
        absl::Status s = service.PushPull(call.push_pull(), absl::Now(), &response);
        if (!s.ok()) {
          CheckCode(s, kShardErrors, "PushPull");
        } else {
          ++accepted_pushes;
          CheckReply(response, "PushPull");
          Check(response.address().worker() == call.push_pull().address().worker(),
                "PushPull answered another worker's address");
        }
        break;
      }
      case FuzzCall::kPull: {
        proto::CompressedBlock response;
        absl::Status s = service.Pull(call.pull(), &response, absl::Now());
        if (!s.ok()) {
          CheckCode(s, kShardErrors, "Pull");
        } else {
          CheckReply(response, "Pull");
        }
        break;
      }
      case FuzzCall::kStats: {
        proto::StatsResponse response;
        service.Stats(&response);
        Check(response.pushes() >= accepted_pushes, "Stats lost accepted pushes");
        break;
      }
      case FuzzCall::kPrepare: {
        proto::PrepareReshardRequest r = call.prepare();
        if (r.next().job().empty()) {
          proto::ClusterConfig next = SessionConfig(session);
          *next.mutable_shards() = r.next().shards();
          next.set_shard_map_epoch(r.next().shard_map_epoch());
          *r.mutable_next() = std::move(next);
        }
        // Short, so that a prepared shard that hears no Commit thaws within the input.
        r.set_prepare_timeout_ms(r.prepare_timeout_ms() % 50);
        absl::StatusOr<proto::PrepareReshardResponse> s = service.PrepareReshard(r);
        if (!s.ok()) CheckCode(s.status(), kShardErrors, "Prepare");
        break;
      }
      case FuzzCall::kCommit: {
        absl::Status s = service.CommitReshard(call.commit().next_epoch(), call.commit().switch_step());
        if (!s.ok()) CheckCode(s, kShardErrors, "Commit");
        break;
      }
      case FuzzCall::kAbort: {
        absl::Status s = service.AbortReshard(call.abort().next_epoch(), call.abort().reason());
        if (!s.ok()) CheckCode(s, kShardErrors, "Abort");
        break;
      }
      case FuzzCall::kTransfer: {
        absl::Status s = service.AcceptTransfer(call.transfer(), absl::Now());
        if (!s.ok()) CheckCode(s, kShardErrors, "Transfer");
        break;
      }
      case FuzzCall::kReshardStatus: {
        proto::ReshardStatusResponse response;
        service.ReshardStatus(&response);
        Check(!response.state().empty(), "ReshardStatus without a state");
        break;
      }
      case FuzzCall::kReplicate: {
        absl::Status s = service.AcceptReplica(call.replicate());
        if (!s.ok()) CheckCode(s, kShardErrors, "Replicate");
        break;
      }
      case FuzzCall::kReportDown: {
        proto::ReportDownResponse response;
        absl::Status s = service.ReportDown(call.report_down(), &response);
        if (!s.ok()) CheckCode(s, kShardErrors, "ReportDown");
        break;
      }
      case FuzzCall::kInstallMap: {
        proto::InstallMapRequest r = call.install_map();
        if (r.map().job().empty()) {
          proto::ClusterConfig map = SessionConfig(session);
          map.set_shard_map_epoch(r.map().shard_map_epoch());
          *map.mutable_down_shards() = r.map().down_shards();
          *map.mutable_joining_shards() = r.map().joining_shards();
          *r.mutable_map() = std::move(map);
        }
        absl::Status s = service.InstallMap(r);
        if (!s.ok()) CheckCode(s, kShardErrors, "InstallMap");
        break;
      }
      case FuzzCall::kRejoin: {
        proto::RejoinResponse response;
        absl::Status s = service.Rejoin(call.rejoin(), &response);
        if (!s.ok()) CheckCode(s, kShardErrors, "Rejoin");
        break;
      }
      case FuzzCall::CALL_NOT_SET:
        break;
    }
  }
  service.Shutdown();
}

}  // namespace
}  // namespace gcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Rejected calls log a warning each; the fuzzer makes millions.
  static const bool quiet = [] {
    gcomp::fuzz::SilenceProtobufLog();
    return gcomp::InitLogging("shard_service_fuzz", "off").ok();
  }();
  (void)quiet;
  gcomp::fuzz::FuzzSession session;
  if (!session.ParseFromArray(data, static_cast<int>(size))) return 0;
  gcomp::fuzz::RunSession(session);
  return 0;
}
