#include "server/chunk_state.h"

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "cluster/cluster_config.h"
#include "cluster/wire_block.h"

namespace gcomp::server {
namespace {

cluster::DirectionCodec Lossless() {
  cluster::DirectionCodec c;
  c.raw = false;
  c.policy.mode = codec::Mode::kLossless;
  return c;
}

absl::Status EncodeFloats(const std::vector<float>& v, proto::CompressedBlock* out) {
  return cluster::EncodeWireBlock(Lossless(), codec::DType::kF32, v.data(), v.size(), out);
}

absl::Status DecodeFloats(const proto::CompressedBlock& block, size_t elements,
                          const std::string& what, std::vector<float>* out) {
  if (block.codec() != proto::CODEC_GCOMP || block.policy().mode() != proto::CODEC_MODE_LOSSLESS) {
    return absl::InvalidArgumentError(absl::StrCat(what, " is not a lossless block"));
  }
  out->resize(elements);
  absl::Status s = cluster::DecodeWireBlock(block, codec::DType::kF32, elements, out->data());
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  return absl::OkStatus();
}

}  // namespace

absl::Status ChunkStateToProto(const std::string& job, const std::string& key, uint32_t chunk,
                               size_t elements, const ChunkSnapshot& snap, proto::ChunkState* out) {
  out->Clear();
  out->set_job(job);
  out->set_key(key);
  out->set_chunk(chunk);
  out->set_elements(elements);
  out->set_started(snap.started);
  out->set_current_step(snap.current_step);
  out->set_completed_step(snap.completed_step);
  out->set_optimizer_steps(snap.optimizer.steps);
  const std::pair<const std::vector<float>*, proto::CompressedBlock* (proto::ChunkState::*)()>
      arrays[] = {{&snap.optimizer.value, &proto::ChunkState::mutable_value},
                  {&snap.optimizer.m, &proto::ChunkState::mutable_first_moment},
                  {&snap.optimizer.v, &proto::ChunkState::mutable_second_moment}};
  for (const auto& [v, get] : arrays) {
    if (v->empty()) continue;
    if (v->size() != elements) {
      return absl::InternalError(absl::StrCat("state of '", key, "' chunk ", chunk, " holds ",
                                              v->size(), " elements, expected ", elements));
    }
    absl::Status s = EncodeFloats(*v, (out->*get)());
    if (!s.ok()) return s;
  }
  if (snap.cached_result != nullptr) *out->mutable_cached_result() = *snap.cached_result;
  return absl::OkStatus();
}

absl::StatusOr<ChunkSnapshot> ChunkStateFromProto(const proto::ChunkState& state, size_t elements,
                                                  codec::DType dtype) {
  const std::string what = absl::StrCat("state of '", state.key(), "' chunk ", state.chunk());
  if (state.elements() != elements) {
    return absl::InvalidArgumentError(absl::StrCat(what, " holds ", state.elements(),
                                                   " elements; the chunk has ", elements));
  }
  ChunkSnapshot snap;
  snap.started = state.started();
  snap.current_step = state.current_step();
  snap.completed_step = state.completed_step();
  snap.optimizer.steps = state.optimizer_steps();
  if (state.has_value()) {
    absl::Status s = DecodeFloats(state.value(), elements, what + " value", &snap.optimizer.value);
    if (!s.ok()) return s;
  }
  if (state.has_first_moment()) {
    absl::Status s =
        DecodeFloats(state.first_moment(), elements, what + " first moment", &snap.optimizer.m);
    if (!s.ok()) return s;
  }
  if (state.has_second_moment()) {
    absl::Status s =
        DecodeFloats(state.second_moment(), elements, what + " second moment", &snap.optimizer.v);
    if (!s.ok()) return s;
  }
  if (state.has_cached_result()) {
    const proto::CompressedBlock& r = state.cached_result();
    absl::Status s = cluster::CheckWireBlock(r, dtype, elements);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, " cached result: ", s.message()));
    if (r.address().key() != state.key() || r.address().chunk() != state.chunk() ||
        r.address().step() != state.completed_step()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " cached result is addressed to '", r.address().key(), "' chunk ",
                       r.address().chunk(), " step ", r.address().step()));
    }
    snap.cached_result = std::make_shared<const proto::CompressedBlock>(r);
  }
  return snap;
}

void StampEpoch(uint64_t epoch, ChunkSnapshot* snap) {
  if (snap->cached_result == nullptr) return;
  auto result = std::make_shared<proto::CompressedBlock>(*snap->cached_result);
  result->mutable_address()->set_shard_map_epoch(epoch);
  snap->cached_result = std::move(result);
}

std::vector<proto::ChunkState> SplitChunkState(proto::ChunkState st) {
  std::vector<proto::ChunkState> parts;
  parts.reserve(4);
  parts.emplace_back();
  auto split_off = [&](auto has, auto release) {
    if (!(st.*has)()) return;
    proto::ChunkState& p = parts.emplace_back();
    p.set_key(st.key());
    p.set_chunk(st.chunk());
    release(&p);
  };
  split_off(&proto::ChunkState::has_first_moment,
            [&](proto::ChunkState* p) { p->set_allocated_first_moment(st.release_first_moment()); });
  split_off(&proto::ChunkState::has_second_moment,
            [&](proto::ChunkState* p) { p->set_allocated_second_moment(st.release_second_moment()); });
  split_off(&proto::ChunkState::has_cached_result,
            [&](proto::ChunkState* p) { p->set_allocated_cached_result(st.release_cached_result()); });
  parts[0] = std::move(st);
  return parts;
}

void MergeChunkStatePart(const proto::ChunkState& part, proto::ChunkState* merged) {
  if (part.has_value()) {
    // The first part: everything but the moments and the cached result.
    proto::ChunkState head = part;
    head.clear_first_moment();
    head.clear_second_moment();
    head.clear_cached_result();
    proto::ChunkState rest = std::move(*merged);
    *merged = std::move(head);
    if (rest.has_first_moment()) merged->set_allocated_first_moment(rest.release_first_moment());
    if (rest.has_second_moment()) merged->set_allocated_second_moment(rest.release_second_moment());
    if (rest.has_cached_result()) merged->set_allocated_cached_result(rest.release_cached_result());
  }
  if (part.has_first_moment()) *merged->mutable_first_moment() = part.first_moment();
  if (part.has_second_moment()) *merged->mutable_second_moment() = part.second_moment();
  if (part.has_cached_result()) *merged->mutable_cached_result() = part.cached_result();
  merged->DiscardUnknownFields();
}

absl::Status CheckChunkStatePart(const proto::ChunkState& part, size_t elements,
                                 size_t max_name_bytes, absl::string_view what) {
  const size_t bound = cluster::MaxWireBytes(elements, codec::DType::kF32);
  size_t longest_name = std::max(part.job().size(), part.key().size());
  for (const proto::CompressedBlock* block :
       {&part.value(), &part.first_moment(), &part.second_moment(), &part.cached_result()}) {
    if (block->data().size() > bound) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " of '", log::Clip(part.key()), "' chunk ", part.chunk(), " holds a block of ",
          block->data().size(), " bytes, above the chunk's bound ", bound));
    }
    longest_name =
        std::max({longest_name, block->address().job().size(), block->address().key().size()});
  }
  if (longest_name > max_name_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " of '", log::Clip(part.key()), "' chunk ", part.chunk(), " holds a name of ",
        longest_name, " bytes, above limits.max_key_bytes = ", max_name_bytes));
  }
  return absl::OkStatus();
}

}  // namespace gcomp::server
