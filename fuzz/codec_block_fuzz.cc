// Fuzz target: one codec block as a shard receives it (codec::InspectBlock, DecodeBlock).
//
// The input is the block's bytes. It is decoded as it is (the checksum usually stops a
// mutated block), then again with its checksum repaired so that every check behind the
// checksum and the section decoders see the mutation. Properties checked besides "no
// crash, leak or overflow": errors carry the documented codes; a block whose header
// inspects cleanly decodes only as its own dtype and element count; and the decoded values
// re-encode under the block's policy and decode back within the policy's promise
// (bit-exact for lossless, ErrorBound for near-lossless).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codec/codec.h"
#include "format/endian.h"
#include "fuzz/fuzz_support.h"

namespace gcomp::fuzz {
namespace {

// Round trips above this many elements are skipped to keep executions fast.
constexpr size_t kMaxRoundTripElements = 4096;

const std::initializer_list<absl::StatusCode> kDecodeErrors = {
    absl::StatusCode::kInvalidArgument, absl::StatusCode::kDataLoss,
    absl::StatusCode::kNotFound};

codec::DType GuessDType(absl::Span<const uint8_t> block) {
  if (block.size() > 5 && block[5] >= 1 && block[5] <= 3) {
    return static_cast<codec::DType>(block[5]);
  }
  return codec::DType::kF32;
}

size_t GuessElements(absl::Span<const uint8_t> block) {
  if (block.size() < 16) return 1;
  const size_t n = format::LoadLE32(block.data() + 12);
  return std::min(std::max<size_t>(n, 1), kMaxDecodeElements);
}

// Decodes with a guessed dtype and size: must fail cleanly or succeed, never crash.
void DecodeAsIs(absl::Span<const uint8_t> block) {
  const codec::DType dtype = GuessDType(block);
  const size_t n = GuessElements(block);
  // Allocated once: a fresh zeroed buffer of up to 256 KiB per input was most of the time
  // the target spent (and the decoder checks the header before it writes anything).
  static std::vector<uint8_t>* const out = new std::vector<uint8_t>(kMaxDecodeElements * 4);
  codec::BlockDecodeOptions options;
  options.tables = &SharedTables();
  absl::Status s = codec::DecodeBlock(block, dtype, out->data(), n, options);
  if (!s.ok()) CheckCode(s, kDecodeErrors, "DecodeBlock");
}

float ElementAsF32(codec::DType dtype, const uint8_t* values, size_t i) {
  float f;
  codec::ToF32(dtype, values + i * codec::DTypeBytes(dtype), 1, &f);
  return f;
}

// Encodes `values` (n elements of dtype) under `policy`, decodes the result and checks the
// codec's promise element by element.
void CheckRoundTrip(codec::DType dtype, const codec::Policy& policy,
                    const std::vector<uint8_t>& values, size_t n) {
  const size_t width = codec::DTypeBytes(dtype);
  std::string encoded;
  absl::Status s = codec::EncodeBlock(dtype, values.data(), n, policy, &encoded);
  Check(s.ok(), absl::StrCat("re-encoding decoded values: ", s.ToString()));
  Check(encoded.size() <= codec::MaxBlockEncodedBytes(n, dtype), "MaxBlockEncodedBytes bound");
  std::vector<uint8_t> back(n * width);
  s = codec::DecodeBlock(codec::AsBytes(encoded), dtype, back.data(), n);
  Check(s.ok(), absl::StrCat("decoding a block the encoder wrote: ", s.ToString()));
  if (policy.mode == codec::Mode::kLossless) {
    Check(std::memcmp(values.data(), back.data(), values.size()) == 0,
          "lossless round trip is not bit-exact");
    return;
  }
  double max_abs = 0;
  for (size_t i = 0; i < n; ++i) {
    const float x = ElementAsF32(dtype, values.data(), i);
    if (std::isfinite(x)) max_abs = std::max(max_abs, std::fabs(static_cast<double>(x)));
  }
  for (size_t i = 0; i < n; ++i) {
    const float x = ElementAsF32(dtype, values.data(), i);
    const float y = ElementAsF32(dtype, back.data(), i);
    if (!std::isfinite(x)) {
      Check(std::memcmp(values.data() + i * width, back.data() + i * width, width) == 0,
            absl::StrCat("non-finite element ", i, " not restored bit-exactly"));
      continue;
    }
    Check(std::isfinite(y), absl::StrCat("finite element ", i, " decoded as ", y));
    const double err = std::fabs(static_cast<double>(y) - static_cast<double>(x));
    Check(err <= codec::ErrorBound(policy, x, max_abs),
          absl::StrCat("element ", i, ": ", x, " decoded as ", y, ", beyond the bound ",
                       codec::ErrorBound(policy, x, max_abs)));
    if (y != 0) Check(std::signbit(x) == std::signbit(y), "sign of a nonzero element flipped");
  }
}

void DecodeRepaired(std::vector<uint8_t> block) {
  RepairBlockChecksum(block.data(), block.size());
  const absl::Span<const uint8_t> bytes(block);
  absl::StatusOr<codec::BlockInfo> info = codec::InspectBlock(bytes);
  if (!info.ok()) {
    CheckCode(info.status(), kDecodeErrors, "InspectBlock");
    DecodeAsIs(bytes);  // DecodeBlock's own checks must refuse it as well
    return;
  }
  Check(info->total_bytes == block.size(), "InspectBlock total_bytes != block size");
  const size_t n = info->elements;
  if (n > kMaxDecodeElements) return;
  const size_t width = codec::DTypeBytes(info->dtype);
  // One spare element, so that a decoder writing past n shows as a changed canary.
  std::vector<uint8_t> out((n + 1) * width, 0xA5);
  codec::BlockDecodeOptions options;
  options.tables = &SharedTables();
  absl::Status s = codec::DecodeBlock(bytes, info->dtype, out.data(), n, options);
  if (!s.ok()) {
    CheckCode(s, kDecodeErrors, "DecodeBlock after a clean InspectBlock");
    return;
  }
  for (size_t i = n * width; i < out.size(); ++i) {
    Check(out[i] == 0xA5, "DecodeBlock wrote past the element count");
  }
  // The same block asked for as another size or dtype must be refused.
  std::vector<uint8_t> other((n + 2) * 4);
  Check(!codec::DecodeBlock(bytes, info->dtype, other.data(), n + 1, options).ok(),
        "DecodeBlock accepted a wrong element count");
  const codec::DType wrong =
      info->dtype == codec::DType::kF32 ? codec::DType::kBF16 : codec::DType::kF32;
  Check(!codec::DecodeBlock(bytes, wrong, other.data(), n, options).ok(),
        "DecodeBlock accepted a wrong dtype");
  if (n >= 1 && n <= kMaxRoundTripElements) {
    out.resize(n * width);
    CheckRoundTrip(info->dtype, info->policy, out, n);
  }
}

}  // namespace
}  // namespace gcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::Span<const uint8_t> input(data, size);
  gcomp::fuzz::DecodeAsIs(input);
  gcomp::fuzz::DecodeRepaired(std::vector<uint8_t>(data, data + size));
  return 0;
}
