#include "fuzz/fuzz_support.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "format/checksum.h"
#include "format/endian.h"
#include "google/protobuf/stubs/logging.h"
#include "xxhash.h"

namespace gcomp::fuzz {
namespace {

constexpr size_t kHeaderBytes = codec::kBlockHeaderBytes;
constexpr size_t kFrameFixedBytes = 24;

}  // namespace

void Check(bool ok, absl::string_view what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz property violated: %.*s\n", static_cast<int>(what.size()),
               what.data());
  std::abort();
}

void CheckCode(const absl::Status& status, std::initializer_list<absl::StatusCode> allowed,
               absl::string_view what) {
  for (absl::StatusCode code : allowed) {
    if (status.code() == code) return;
  }
  std::fprintf(stderr, "fuzz property violated: %.*s returned an undocumented status: %s\n",
               static_cast<int>(what.size()), what.data(), status.ToString().c_str());
  std::abort();
}

void RepairBlockChecksum(uint8_t* block, size_t size) {
  if (size < kHeaderBytes) return;
  format::StoreBlockChecksum(
      block, XXH64(block + kHeaderBytes, size - kHeaderBytes, format::BlockChecksumSeed(block)));
}

void RepairFrameChecksums(std::string* frame) {
  uint8_t* p = reinterpret_cast<uint8_t*>(frame->data());
  const size_t size = frame->size();
  if (size < kFrameFixedBytes) return;
  const uint64_t count = format::LoadLE32(p + 20);
  const uint64_t table_end = kFrameFixedBytes + 4 * count;
  if (table_end + 8 > size) return;
  format::StoreLE64(p + table_end, XXH64(p, table_end, 0));
  uint64_t pos = table_end + 8;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t block_size = format::LoadLE32(p + kFrameFixedBytes + 4 * i);
    if (pos + block_size > size) return;
    RepairBlockChecksum(p + pos, block_size);
    pos += block_size;
  }
}

void SilenceProtobufLog() { google::protobuf::SetLogHandler(nullptr); }

const codec::CodeTable& SharedTable() {
  static const codec::CodeTable* table = [] {
    // A gradient-like sample: magnitudes spread over a few binades, both signs.
    std::vector<float> sample(1024);
    for (size_t i = 0; i < sample.size(); ++i) {
      const float v = std::ldexp(1.0f + 0.001f * static_cast<float>(i % 97),
                                 -12 - static_cast<int>(i % 9));
      sample[i] = (i % 3 == 0) ? -v : v;
    }
    absl::StatusOr<codec::CodeTable> built =
        codec::CodeTable::Build(codec::DType::kF32, sample.data(), sample.size(), codec::Policy());
    Check(built.ok(), "building the shared code table");
    return new codec::CodeTable(*std::move(built));
  }();
  return *table;
}

const codec::CodeTableStore& SharedTables() {
  static const codec::CodeTableStore* store = [] {
    auto* s = new codec::CodeTableStore();
    s->Add(SharedTable());
    return s;
  }();
  return *store;
}

}  // namespace gcomp::fuzz
