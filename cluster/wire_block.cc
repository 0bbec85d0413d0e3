#include "cluster/wire_block.h"

#include <cstring>

#include "absl/strings/str_cat.h"
// XXH64_state_t and XXH3_state_t on the stack (the streaming checksum of a payload in pieces).
#define XXH_STATIC_LINKING_ONLY
#include "xxhash.h"
#if defined(__x86_64__)
// XXH3 through libxxhash's run-time dispatch (AVX-512, AVX2 or SSE2 by the CPU): the plain
// entry points run SSE2 code, and the streaming one at a quarter of the dispatched speed
// (17 against 60-67 GB/s on the development VM, payloads in 16-64 KiB pieces).
#include "xxh_x86dispatch.h"
#endif

namespace gcomp::cluster {

proto::DType ToProto(codec::DType dtype) { return static_cast<proto::DType>(dtype); }

absl::StatusOr<codec::DType> FromProto(proto::DType dtype) {
  switch (dtype) {
    case proto::DTYPE_F32:
      return codec::DType::kF32;
    case proto::DTYPE_BF16:
      return codec::DType::kBF16;
    case proto::DTYPE_F16:
      return codec::DType::kF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(dtype)));
  }
}

size_t MaxWireBytes(size_t n, codec::DType dtype) {
  return std::max(codec::MaxBlockEncodedBytes(n, dtype), n * codec::DTypeBytes(dtype));
}

namespace {

// FillWireBlock; `own` when this process's CPU codec has just written `bytes`.
absl::Status Seal(const DirectionCodec& dc, codec::DType dtype, size_t n, std::string bytes,
                  bool own, proto::CompressedBlock* out) {
  out->set_dtype(ToProto(dtype));
  out->set_elements(n);
  if (dc.raw) {
    if (bytes.size() != n * codec::DTypeBytes(dtype)) {
      return absl::InternalError("raw chunk of the wrong size");
    }
    out->set_codec(proto::CODEC_RAW);
    out->clear_policy();
    out->clear_sections();
  } else {
    out->set_codec(proto::CODEC_GCOMP);
    proto::Policy* p = out->mutable_policy();
    p->set_mode(dc.policy.mode == codec::Mode::kLossless ? proto::CODEC_MODE_LOSSLESS
                                                         : proto::CODEC_MODE_NEAR_LOSSLESS);
    p->set_rel_bits(dc.policy.rel_bits);
    p->set_abs_log2(dc.policy.abs_log2);
    // The wire checksum made below is all a receiver verifies before decoding, so it must
    // seal bytes known to be as encoded. Blocks just written here need no check; blocks made
    // elsewhere (the GPU codec, then copied to host memory) are checked against their own
    // checksum first.
    absl::StatusOr<codec::BlockInfo> info =
        own ? codec::InspectBlockSkippingChecksum(codec::AsBytes(bytes))
            : codec::InspectBlock(codec::AsBytes(bytes));
    if (!info.ok()) {
      return absl::InternalError(absl::StrCat(
          own ? "own block unreadable: " : "encoded block unreadable: ", info.status().message()));
    }
    proto::SectionSizes* sec = out->mutable_sections();
    sec->set_header_bytes(info->header_bytes);
    sec->set_zero_map_bytes(info->zero_map_bytes);
    sec->set_table_bytes(info->table_bytes);
    sec->set_exponent_bytes(info->exponent_bytes);
    sec->set_mantissa_bytes(info->mantissa_bytes);
  }
  const absl::string_view all = bytes;
  absl::StatusOr<uint64_t> sum = WireChecksum(dc.checksum, WirePieces(&all, 1));
  if (!sum.ok()) return sum.status();
  out->set_checksum(*sum);
  out->set_checksum_kind(dc.checksum);
  *out->mutable_data() = std::move(bytes);
  return absl::OkStatus();
}

}  // namespace

absl::Status FillWireBlock(const DirectionCodec& dc, codec::DType dtype, size_t n,
                           std::string bytes, proto::CompressedBlock* out) {
  return Seal(dc, dtype, n, std::move(bytes), /*own=*/false, out);
}

absl::Status EncodeWireBlock(const DirectionCodec& dc, codec::DType dtype, const void* data,
                             size_t n, proto::CompressedBlock* out) {
  std::string bytes = std::move(*out->mutable_data());
  bytes.clear();
  if (dc.raw) {
    bytes.assign(static_cast<const char*>(data), n * codec::DTypeBytes(dtype));
  } else {
    absl::Status s = codec::EncodeBlock(dtype, data, n, dc.policy, &bytes);
    if (!s.ok()) return s;
  }
  return Seal(dc, dtype, n, std::move(bytes), /*own=*/true, out);
}

absl::StatusOr<uint64_t> WireChecksum(proto::ChecksumKind kind, WirePieces data) {
  switch (kind) {
    case proto::CHECKSUM_XXH64: {
      if (data.size() == 1) return XXH64(data[0].data(), data[0].size(), 0);
      XXH64_state_t state;
      XXH64_reset(&state, 0);
      for (absl::string_view piece : data) XXH64_update(&state, piece.data(), piece.size());
      return XXH64_digest(&state);
    }
    case proto::CHECKSUM_XXH3_64: {
      if (data.size() == 1) return XXH3_64bits(data[0].data(), data[0].size());
      XXH3_state_t state;
      XXH3_INITSTATE(&state);
      XXH3_64bits_reset(&state);
      for (absl::string_view piece : data) XXH3_64bits_update(&state, piece.data(), piece.size());
      return XXH3_64bits_digest(&state);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown block checksum kind ", static_cast<int>(kind)));
  }
}

absl::Status UseXxh64(proto::CompressedBlock* header, WirePieces data) {
  if (header->checksum_kind() == proto::CHECKSUM_XXH64) return absl::OkStatus();
  // The old seal is checked before the new one replaces it: a receiver decodes on the wire
  // checksum alone, so a held block damaged since it was sealed must not get a valid one.
  absl::StatusOr<uint64_t> held = WireChecksum(header->checksum_kind(), data);
  if (!held.ok()) return held.status();
  if (*held != header->checksum()) {
    return absl::DataLossError("block checksum mismatch before re-checksumming by XXH64");
  }
  absl::StatusOr<uint64_t> sum = WireChecksum(proto::CHECKSUM_XXH64, data);
  if (!sum.ok()) return sum.status();
  header->set_checksum(*sum);
  header->clear_checksum_kind();
  return absl::OkStatus();
}

absl::Status UseXxh64(proto::CompressedBlock* block) {
  const absl::string_view data = block->data();
  return UseXxh64(block, WirePieces(&data, 1));
}

namespace {

size_t TotalSize(WirePieces data) {
  size_t total = 0;
  for (absl::string_view piece : data) total += piece.size();
  return total;
}

// The payload as one contiguous view: the only piece, or the pieces joined into *scratch.
absl::string_view Joined(WirePieces data, std::string* scratch) {
  if (data.size() == 1) return data[0];
  if (data.empty()) return absl::string_view();
  scratch->clear();
  scratch->reserve(TotalSize(data));
  for (absl::string_view piece : data) scratch->append(piece.data(), piece.size());
  return *scratch;
}

// CheckWireBlock with the GComp payload, once checked, in *gcomp (a view of `data` or of
// *scratch). With `decode_follows` the codec block's own checksum is not recomputed: the
// wire checksum just verified covers the same bytes, and each pass over them costs about 6%
// of a decode (XXH64; the wire's XXH3 takes a fraction of that).
absl::Status Check(const proto::CompressedBlock& block, WirePieces data, codec::DType dtype,
                   size_t n, bool decode_follows, std::string* scratch, absl::string_view* gcomp) {
  if (block.dtype() != ToProto(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("block dtype ", WireDTypeName(block.dtype()),
                                                   " does not match tensor dtype ",
                                                   codec::DTypeName(dtype)));
  }
  if (block.elements() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("block holds ", block.elements(), " elements, chunk has ", n));
  }
  const size_t size = TotalSize(data);
  absl::StatusOr<uint64_t> sum = WireChecksum(block.checksum_kind(), data);
  if (!sum.ok()) return sum.status();
  if (*sum != block.checksum()) {
    return absl::DataLossError("block checksum mismatch: data corrupted in transit");
  }
  if (block.codec() == proto::CODEC_RAW) {
    // Divided, not multiplied: n * bytes wraps for n near 2^64 and could match a short block.
    if (size % codec::DTypeBytes(dtype) != 0 || size / codec::DTypeBytes(dtype) != n) {
      return absl::InvalidArgumentError(absl::StrCat("raw block carries ", size,
                                                     " bytes, expected ",
                                                     n * codec::DTypeBytes(dtype)));
    }
    return absl::OkStatus();
  }
  if (block.codec() != proto::CODEC_GCOMP) {
    return absl::InvalidArgumentError(absl::StrCat("unknown block codec ", block.codec()));
  }
  const absl::string_view bytes = Joined(data, scratch);
  absl::StatusOr<codec::BlockInfo> info =
      decode_follows ? codec::InspectBlockSkippingChecksum(codec::AsBytes(bytes))
                     : codec::InspectBlock(codec::AsBytes(bytes));
  if (!info.ok()) {
    return absl::DataLossError(absl::StrCat("corrupt codec block: ", info.status().message()));
  }
  if (info->elements != n || info->dtype != dtype) {
    return absl::InvalidArgumentError("codec block header disagrees with the block's dtype or size");
  }
  if (block.has_sections() &&
      (block.sections().header_bytes() != info->header_bytes ||
       block.sections().mantissa_bytes() != info->mantissa_bytes ||
       block.sections().exponent_bytes() != info->exponent_bytes ||
       block.sections().zero_map_bytes() != info->zero_map_bytes ||
       block.sections().table_bytes() != info->table_bytes)) {
    return absl::InvalidArgumentError("mirrored section sizes disagree with the codec block");
  }
  *gcomp = bytes;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckWireBlock(const proto::CompressedBlock& header, WirePieces data,
                            codec::DType dtype, size_t n, std::string* scratch) {
  absl::string_view gcomp;
  return Check(header, data, dtype, n, /*decode_follows=*/false, scratch, &gcomp);
}

absl::Status DecodeWireBlock(const proto::CompressedBlock& header, WirePieces data,
                             codec::DType dtype, size_t n, void* out, std::string* scratch) {
  absl::string_view gcomp;
  if (absl::Status s = Check(header, data, dtype, n, /*decode_follows=*/true, scratch, &gcomp);
      !s.ok()) {
    return s;
  }
  if (header.codec() == proto::CODEC_RAW) {
    char* to = static_cast<char*>(out);
    for (absl::string_view piece : data) {
      std::memcpy(to, piece.data(), piece.size());
      to += piece.size();
    }
    return absl::OkStatus();
  }
  codec::BlockDecodeOptions options;
  options.verify_checksum = false;  // Check verified the wire checksum over these bytes
  absl::Status s = codec::DecodeBlock(codec::AsBytes(gcomp), dtype, out, n, options);
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) {
    return absl::DataLossError(absl::StrCat("corrupt codec block: ", s.message()));
  }
  return s;
}

absl::Status CheckWireBlock(const proto::CompressedBlock& block, codec::DType dtype,
                            size_t n) {
  const absl::string_view data = block.data();
  return CheckWireBlock(block, WirePieces(&data, 1), dtype, n, nullptr);
}

std::string WireDTypeName(proto::DType dtype) {
  const std::string& name = proto::DType_Name(dtype);
  return name.empty() ? absl::StrCat("unknown value ", static_cast<int>(dtype)) : name;
}

absl::Status DecodeWireBlock(const proto::CompressedBlock& block, codec::DType dtype, size_t n,
                             void* out) {
  const absl::string_view data = block.data();
  return DecodeWireBlock(block, WirePieces(&data, 1), dtype, n, out, nullptr);
}

}  // namespace gcomp::cluster
