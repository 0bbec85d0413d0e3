#include "cluster/wire_block.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "xxhash.h"

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

absl::Status FillWireBlock(const DirectionCodec& dc, codec::DType dtype, size_t n,
                           std::string bytes, proto::CompressedBlock* out) {
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
    absl::StatusOr<codec::BlockInfo> info = codec::InspectBlock(codec::AsBytes(bytes));
    if (!info.ok()) {
      return absl::InternalError(
          absl::StrCat("own block unreadable: ", info.status().message()));
    }
    proto::SectionSizes* sec = out->mutable_sections();
    sec->set_header_bytes(info->header_bytes);
    sec->set_zero_map_bytes(info->zero_map_bytes);
    sec->set_table_bytes(info->table_bytes);
    sec->set_exponent_bytes(info->exponent_bytes);
    sec->set_mantissa_bytes(info->mantissa_bytes);
  }
  out->set_checksum(XXH64(bytes.data(), bytes.size(), 0));
  *out->mutable_data() = std::move(bytes);
  return absl::OkStatus();
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
  return FillWireBlock(dc, dtype, n, std::move(bytes), out);
}

absl::Status CheckWireBlock(const proto::CompressedBlock& block, codec::DType dtype,
                            size_t n) {
  if (block.dtype() != ToProto(dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("block dtype ", proto::DType_Name(block.dtype()),
                                                   " does not match tensor dtype ",
                                                   codec::DTypeName(dtype)));
  }
  if (block.elements() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("block holds ", block.elements(), " elements, chunk has ", n));
  }
  const std::string& data = block.data();
  if (XXH64(data.data(), data.size(), 0) != block.checksum()) {
    return absl::DataLossError("block checksum mismatch: data corrupted in transit");
  }
  if (block.codec() == proto::CODEC_RAW) {
    // Divided, not multiplied: n * bytes wraps for n near 2^64 and could match a short block.
    if (data.size() % codec::DTypeBytes(dtype) != 0 ||
        data.size() / codec::DTypeBytes(dtype) != n) {
      return absl::InvalidArgumentError(absl::StrCat("raw block carries ", data.size(),
                                                     " bytes, expected ",
                                                     n * codec::DTypeBytes(dtype)));
    }
    return absl::OkStatus();
  }
  if (block.codec() != proto::CODEC_GCOMP) {
    return absl::InvalidArgumentError(absl::StrCat("unknown block codec ", block.codec()));
  }
  absl::StatusOr<codec::BlockInfo> info = codec::InspectBlock(codec::AsBytes(data));
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
  return absl::OkStatus();
}

absl::Status DecodeWireBlock(const proto::CompressedBlock& block, codec::DType dtype, size_t n,
                             void* out) {
  if (absl::Status s = CheckWireBlock(block, dtype, n); !s.ok()) return s;
  const std::string& data = block.data();
  if (block.codec() == proto::CODEC_RAW) {
    std::memcpy(out, data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status s = codec::DecodeBlock(codec::AsBytes(data), dtype, out, n);
  if (!s.ok() && s.code() != absl::StatusCode::kInvalidArgument) {
    return absl::DataLossError(absl::StrCat("corrupt codec block: ", s.message()));
  }
  return s;
}

}  // namespace gcomp::cluster
