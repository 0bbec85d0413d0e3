// Fuzz target: reading a PushPull message from the slices gRPC received it in
// (cluster::WireMessage::Parse) and decoding its payload from those pieces.
//
// The input is the message's bytes; the slicing comes from a hash of them (up to 15 cuts,
// 1-byte slices among them). Properties: Parse accepts exactly what protobuf's own parser
// accepts, with InvalidArgument otherwise; an accepted message has the same fields and
// payload as protobuf reads; checking and decoding from the pieces gives the same status
// and the same elements as from the parsed protobuf; a message sent again (Own +
// Serialize) is the protobuf encoding of the same block.
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/wire_block.h"
#include "cluster/wire_message.h"
#include "codec/codec.h"
#include "fuzz/fuzz_support.h"
#include "proto/block.pb.h"
#include "xxhash.h"

namespace gcomp::fuzz {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  grpc::Slice one;
  Check(buffer.DumpToSingleSlice(&one).ok(), "DumpToSingleSlice failed");
  return std::string(reinterpret_cast<const char*>(one.begin()), one.size());
}

void CompareDecodes(const cluster::WireMessage& m, const proto::CompressedBlock& block) {
  absl::StatusOr<codec::DType> dtype = cluster::FromProto(block.dtype());
  const codec::DType as = dtype.ok() ? *dtype : codec::DType::kF32;
  const size_t n = block.elements();
  std::string scratch;
  const absl::Status piece_check = cluster::CheckWireBlock(m.header(), m.data(), as, n, &scratch);
  const absl::Status whole_check = cluster::CheckWireBlock(block, as, n);
  Check(piece_check == whole_check, "CheckWireBlock differs between pieces and the whole block");
  if (n > kMaxDecodeElements) return;
  const size_t width = codec::DTypeBytes(as);
  std::vector<uint8_t> from_pieces((n + 1) * width, 0x5A), from_whole((n + 1) * width, 0x5A);
  const absl::Status a =
      cluster::DecodeWireBlock(m.header(), m.data(), as, n, from_pieces.data(), &scratch);
  const absl::Status b = cluster::DecodeWireBlock(block, as, n, from_whole.data());
  Check(a == b, "DecodeWireBlock differs between pieces and the whole block");
  if (a.ok()) Check(from_pieces == from_whole, "pieces decode to other elements");
}

}  // namespace
}  // namespace gcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using gcomp::fuzz::Check;
  static const bool quiet = (gcomp::fuzz::SilenceProtobufLog(), true);
  (void)quiet;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  std::mt19937_64 rng(XXH64(data, size, 1));
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  const int cuts = static_cast<int>(rng() % 16);
  for (int i = 0; i < cuts && from < size; ++i) {
    const size_t len = (rng() % 4 == 0) ? 1 : 1 + rng() % (size - from);
    slices.emplace_back(bytes.data() + from, len);
    from += len;
  }
  if (from < size) slices.emplace_back(bytes.data() + from, size - from);
  const grpc::ByteBuffer buffer(slices.data(), slices.size());

  gcomp::cluster::WireMessage m;
  const grpc::Status parsed = m.Parse(buffer);
  gcomp::proto::CompressedBlock block;
  const bool reference = block.ParseFromString(bytes);
  Check(parsed.ok() == reference,
        absl::StrCat("WireMessage::Parse and protobuf disagree on acceptance: Parse says '",
                     parsed.error_message(), "', protobuf ", reference ? "accepts" : "refuses"));
  if (!parsed.ok()) {
    Check(parsed.error_code() == grpc::StatusCode::INVALID_ARGUMENT,
          "WireMessage::Parse refused with a code other than INVALID_ARGUMENT");
    return 0;
  }
  std::string payload;
  for (absl::string_view piece : m.data()) payload.append(piece.data(), piece.size());
  Check(payload == block.data(), "the payload differs from protobuf's");
  gcomp::proto::CompressedBlock header = block;
  header.clear_data();
  Check(m.header().SerializeAsString() == header.SerializeAsString(),
        "the header fields differ from protobuf's");
  gcomp::fuzz::CompareDecodes(m, block);

  grpc::ByteBuffer again;
  Check(gcomp::cluster::WireMessage::Own(m.ToBlock()).Serialize(&again).ok(), "Serialize failed");
  gcomp::proto::CompressedBlock round;
  Check(round.ParseFromString(gcomp::fuzz::Flatten(again)), "a sent message does not parse");
  Check(round.SerializeAsString() == block.SerializeAsString(), "a sent message changed the block");
  return 0;
}
