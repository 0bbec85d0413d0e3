// Fuzz target: the wire checks of a pushed block (cluster::CheckWireBlock, DecodeWireBlock).
//
// The input is a serialized proto::CompressedBlock; bytes that do not parse are dropped
// (the gRPC layer would refuse them too). The block is checked and decoded as the tensor
// it names (its own dtype and element count) and as a mismatching one, first as it is,
// then with the codec block's checksum and the wire checksum repaired. Properties: errors
// are InvalidArgument or DataLoss as wire_block.h promises; a raw block that passes holds
// exactly n elements (for any n, even one whose byte size overflows); a block
// DecodeWireBlock accepts passes CheckWireBlock, short of the codec block's own checksum,
// which only CheckWireBlock recomputes; the decoder writes nothing past n.
#include <cstdint>
#include <string>
#include <vector>

#include "cluster/wire_block.h"
#include "codec/codec.h"
#include "fuzz/fuzz_support.h"
#include "proto/block.pb.h"

namespace gcomp::fuzz {
namespace {

const std::initializer_list<absl::StatusCode> kWireErrors = {absl::StatusCode::kInvalidArgument,
                                                             absl::StatusCode::kDataLoss};

void CheckAndDecode(const proto::CompressedBlock& block, codec::DType dtype, size_t n) {
  const absl::Status checked = cluster::CheckWireBlock(block, dtype, n);
  if (!checked.ok()) CheckCode(checked, kWireErrors, "CheckWireBlock");
  const size_t width = codec::DTypeBytes(dtype);
  if (checked.ok() && block.codec() == proto::CODEC_RAW) {
    Check(block.data().size() % width == 0 && block.data().size() / width == n,
          "CheckWireBlock accepted a raw block whose bytes do not hold n elements");
  }
  if (n > kMaxDecodeElements) return;
  std::vector<uint8_t> out((n + 1) * width, 0x5A);
  const absl::Status decoded = cluster::DecodeWireBlock(block, dtype, n, out.data());
  if (!decoded.ok()) {
    CheckCode(decoded, kWireErrors, "DecodeWireBlock");
    return;
  }
  // The decode trusts the wire checksum and skips the codec block's own (it covers the
  // same bytes); CheckWireBlock verifies both, so that is the one refusal they may differ in.
  Check(checked.ok() || checked.message() == "corrupt codec block: block checksum mismatch",
        "DecodeWireBlock accepted a block CheckWireBlock refuses for more than its own checksum");
  for (size_t i = n * width; i < out.size(); ++i) {
    Check(out[i] == 0x5A, "DecodeWireBlock wrote past the element count");
  }
}

void CheckAsTensors(const proto::CompressedBlock& block) {
  absl::StatusOr<codec::DType> dtype = cluster::FromProto(block.dtype());
  const codec::DType own = dtype.ok() ? *dtype : codec::DType::kF32;
  CheckAndDecode(block, own, block.elements());
  CheckAndDecode(block, own == codec::DType::kF16 ? codec::DType::kF32 : codec::DType::kF16,
                 block.elements());
  if (block.elements() > 0) CheckAndDecode(block, own, block.elements() - 1);
}

}  // namespace
}  // namespace gcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (gcomp::fuzz::SilenceProtobufLog(), true);
  (void)quiet;
  gcomp::proto::CompressedBlock block;
  if (!block.ParseFromArray(data, static_cast<int>(size))) return 0;
  gcomp::fuzz::CheckAsTensors(block);
  std::string* bytes = block.mutable_data();
  gcomp::fuzz::RepairBlockChecksum(reinterpret_cast<uint8_t*>(bytes->data()), bytes->size());
  // By the kind the input names; an unknown kind stays a refused block.
  const absl::string_view payload = *bytes;
  absl::StatusOr<uint64_t> sum =
      gcomp::cluster::WireChecksum(block.checksum_kind(), gcomp::cluster::WirePieces(&payload, 1));
  if (sum.ok()) block.set_checksum(*sum);
  gcomp::fuzz::CheckAsTensors(block);
  return 0;
}
