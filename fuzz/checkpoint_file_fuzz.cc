// Fuzz target: reading a checkpoint data file (server::ParseCheckpointFile) and the chunk
// states in it (server::ChunkStateFromProto), what a shard runs on every file at restore.
//
// The input is a data file's bytes (docs/CHECKPOINT.md). It is parsed as it is, then with
// every record checksum, the record count and the file checksum repaired so that mutations
// reach the record parser and the chunk-state checks. Properties: ParseCheckpointFile fails
// only with DataLoss and never crashes; an accepted file serialized again parses to the
// same records; every chunk state either decodes to arrays of exactly its element count or
// fails with InvalidArgument or DataLoss.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "codec/codec.h"
#include "format/endian.h"
#include "fuzz/fuzz_support.h"
#include "proto/chunk_state.pb.h"
#include "server/checkpoint.h"
#include "server/chunk_state.h"
#include "xxhash.h"

namespace gcomp::fuzz {
namespace {

// Rewrites the record checksums, the record count and the file checksum to match.
std::string Repair(std::string f) {
  constexpr size_t kHead = 8, kTail = 24;
  if (f.size() < kHead + kTail) return f;
  uint8_t* const p = reinterpret_cast<uint8_t*>(f.data());
  const size_t body_end = f.size() - kTail;
  size_t pos = kHead;
  uint64_t count = 0;
  while (body_end - pos >= 12) {
    const uint64_t len = format::LoadLE32(p + pos);
    if (body_end - pos - 4 < len + 8) break;
    format::StoreLE64(p + pos + 4 + len, XXH64(p + pos + 4, len, 0));
    pos += 4 + len + 8;
    ++count;
  }
  format::StoreLE64(p + body_end + 8, count);
  format::StoreLE64(p + body_end + 16, XXH64(p, body_end, 0));
  return f;
}

void CheckFile(const std::string& bytes) {
  absl::StatusOr<std::vector<proto::CheckpointRecord>> records =
      server::ParseCheckpointFile(bytes, "fuzz.ckpt");
  if (!records.ok()) {
    CheckCode(records.status(), {absl::StatusCode::kDataLoss}, "ParseCheckpointFile");
    return;
  }
  absl::StatusOr<std::vector<proto::CheckpointRecord>> again =
      server::ParseCheckpointFile(server::SerializeCheckpointFile(*records), "again.ckpt");
  Check(again.ok() && again->size() == records->size(),
        "an accepted file serialized again does not parse to as many records");
  codec::DType dtype = codec::DType::kF32;
  for (const proto::CheckpointRecord& r : *records) {
    if (r.has_declaration()) {
      dtype = r.declaration().dtype() == proto::DTYPE_BF16  ? codec::DType::kBF16
              : r.declaration().dtype() == proto::DTYPE_F16 ? codec::DType::kF16
                                                            : codec::DType::kF32;
      continue;
    }
    const proto::ChunkState& s = r.chunk();
    if (s.elements() > kMaxDecodeElements) continue;
    absl::StatusOr<server::ChunkSnapshot> snap = server::ChunkStateFromProto(s, s.elements(), dtype);
    if (!snap.ok()) {
      CheckCode(snap.status(), {absl::StatusCode::kInvalidArgument, absl::StatusCode::kDataLoss},
                "ChunkStateFromProto");
      continue;
    }
    for (const std::vector<float>* v : {&snap->optimizer.value, &snap->optimizer.m, &snap->optimizer.v}) {
      Check(v->empty() || v->size() == s.elements(), "a decoded array is not the chunk's size");
    }
  }
}

}  // namespace
}  // namespace gcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (gcomp::fuzz::SilenceProtobufLog(), true);
  (void)quiet;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  gcomp::fuzz::CheckFile(bytes);
  gcomp::fuzz::CheckFile(gcomp::fuzz::Repair(bytes));
  return 0;
}
