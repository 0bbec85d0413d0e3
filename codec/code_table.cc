// Shared exponent code tables (CodeTable, CodeTableStore).
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "codec/codec.h"
#include "codec/internal/format.h"
#include "codec/internal/huffman.h"

namespace gcomp::codec {

absl::StatusOr<CodeTable> CodeTable::Build(DType dtype, const void* data, size_t n,
                                           const Policy& policy) {
  if (absl::Status st = ValidatePolicy(policy); !st.ok()) return st;
  // Encode the sample once and count the symbols of its blocks.
  BufferOptions options;
  options.policy = policy;
  std::string frame;
  if (absl::Status st = EncodeBuffer(dtype, data, n, options, &frame); !st.ok()) return st;
  absl::StatusOr<FrameInfo> info = InspectFrame(AsBytes(frame));
  if (!info.ok()) return info.status();
  const internal::FloatBits lay = internal::FloatBitsOf(dtype);
  uint64_t freq[256] = {};
  std::vector<uint8_t> syms;
  for (absl::Span<const uint8_t> block : info->blocks) {
    absl::StatusOr<BlockInfo> b = InspectBlock(block);
    if (!b.ok()) return b.status();
    // Decode the block and recompute its symbols (the rounded exponent fields).
    std::vector<uint8_t> values(size_t{b->elements} * DTypeBytes(dtype));
    if (absl::Status st = DecodeBlock(block, dtype, values.data(), b->elements); !st.ok()) {
      return st;
    }
    const size_t bytes = DTypeBytes(dtype);
    for (size_t i = 0; i < b->elements; ++i) {
      uint32_t u = 0;
      std::memcpy(&u, values.data() + i * bytes, bytes);
      const uint32_t mag = u & ((uint32_t{1} << (lay.total_bits - 1)) - 1);
      if (mag == 0) continue;
      freq[mag >> lay.mant_bits] += 1;
    }
  }
  // Symbols within kMargin of the sample's range get weight 1, so the table also codes blocks
  // whose exponents reach a little further; a block with a symbol outside it carries its own.
  constexpr int kMargin = 4;
  int lo = lay.alphabet(), hi = -1;
  for (int s = 0; s < lay.alphabet(); ++s) {
    if (freq[s] > 0) lo = std::min(lo, s), hi = std::max(hi, s);
  }
  if (hi < 0) lo = hi = 0;
  for (int s = std::max(0, lo - kMargin); s <= std::min(lay.alphabet() - 1, hi + kMargin); ++s) {
    freq[s] += 1;
  }
  internal::HuffmanCode code;
  internal::BuildLengths(freq, lay.alphabet(), &code);
  internal::AssignCodes(&code);
  CodeTable table;
  table.dtype_ = dtype;
  internal::SerializeTable(code, &table.bytes_);
  table.id_ = XXH64(table.bytes_.data(), table.bytes_.size(), static_cast<uint64_t>(dtype));
  return table;
}

absl::StatusOr<CodeTable> CodeTable::Parse(DType dtype, absl::Span<const uint8_t> bytes) {
  internal::HuffmanCode code;
  if (absl::Status st = internal::ParseTable(bytes, internal::FloatBitsOf(dtype).alphabet(), &code);
      !st.ok()) {
    return st;
  }
  CodeTable table;
  table.dtype_ = dtype;
  table.bytes_.assign(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  table.id_ = XXH64(bytes.data(), bytes.size(), static_cast<uint64_t>(dtype));
  return table;
}

uint64_t CodeTableStore::Add(const CodeTable& table) {
  absl::MutexLock lock(&mu_);
  tables_.emplace(table.id(), table);
  return table.id();
}

absl::StatusOr<CodeTable> CodeTableStore::Find(uint64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(id);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown code table id ", id));
  }
  return it->second;
}

size_t CodeTableStore::size() const {
  absl::MutexLock lock(&mu_);
  return tables_.size();
}

}  // namespace gcomp::codec
