// Fuzz target: one codec frame, a whole buffer of blocks (codec::InspectFrame, DecodeBuffer).
//
// The input is the frame's bytes, inspected as it is and then with the header checksum and
// every block checksum repaired. A frame that inspects cleanly is decoded on the calling
// thread and, when it decodes and has several blocks, again on 2 threads; both must agree
// byte for byte (the decoded bytes never depend on threads). Errors must carry the
// documented codes.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "codec/codec.h"
#include "fuzz/fuzz_support.h"

namespace gcomp::fuzz {
namespace {

const std::initializer_list<absl::StatusCode> kDecodeErrors = {
    absl::StatusCode::kInvalidArgument, absl::StatusCode::kDataLoss,
    absl::StatusCode::kNotFound};

void Inspect(absl::Span<const uint8_t> frame) {
  absl::StatusOr<codec::FrameInfo> info = codec::InspectFrame(frame);
  if (!info.ok()) {
    CheckCode(info.status(), kDecodeErrors, "InspectFrame");
    return;
  }
  for (absl::Span<const uint8_t> block : info->blocks) {
    Check(block.data() >= frame.data() &&
              block.data() + block.size() <= frame.data() + frame.size(),
          "InspectFrame returned a block span outside the frame");
  }
}

void DecodeRepaired(std::string frame) {
  RepairFrameChecksums(&frame);
  const absl::Span<const uint8_t> bytes = codec::AsBytes(frame);
  absl::StatusOr<codec::FrameInfo> info = codec::InspectFrame(bytes);
  if (!info.ok()) {
    CheckCode(info.status(), kDecodeErrors, "InspectFrame");
    return;
  }
  if (info->elements > kMaxDecodeElements) return;
  const size_t n = info->elements;
  const size_t width = codec::DTypeBytes(info->dtype);
  std::vector<uint8_t> serial(n * width);
  codec::BufferDecodeOptions options;
  options.tables = &SharedTables();
  absl::Status s = codec::DecodeBuffer(bytes, info->dtype, serial.data(), n, options);
  if (!s.ok()) {
    CheckCode(s, kDecodeErrors, "DecodeBuffer");
    return;
  }
  if (info->blocks.size() >= 2) {
    // A pool made for this call (not one kept across inputs: its helpers would free their
    // state after the input returned, which libFuzzer's leak check reads as a leak).
    std::vector<uint8_t> parallel(n * width);
    options.threads = 2;
    s = codec::DecodeBuffer(bytes, info->dtype, parallel.data(), n, options);
    Check(s.ok(), "DecodeBuffer fails on 2 threads where it succeeds on 1");
    Check(serial == parallel, "DecodeBuffer bytes depend on the thread count");
  }
  // Asked for the wrong element count, the frame must be refused.
  std::vector<uint8_t> other((n + 1) * width);
  Check(!codec::DecodeBuffer(bytes, info->dtype, other.data(), n + 1, 1).ok(),
        "DecodeBuffer accepted a wrong element count");
}

}  // namespace
}  // namespace gcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  gcomp::fuzz::Inspect(absl::Span<const uint8_t>(data, size));
  gcomp::fuzz::DecodeRepaired(std::string(reinterpret_cast<const char*>(data), size));
  return 0;
}
