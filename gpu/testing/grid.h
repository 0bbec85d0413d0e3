// Inputs shared by the GPU codec tests: the codec's value patterns plus sparse and dense
// ones (to reach every zero-map kind), a policy grid, and the real gradients cut into chunks.
#ifndef GCOMP_GPU_TESTING_GRID_H_
#define GCOMP_GPU_TESTING_GRID_H_

#include <xxhash.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/npy.h"
#include "codec/codec.h"
#include "codec/testing/gradients.h"
#include "codec/testing/values.h"
#include "format/checksum.h"

namespace gcomp::gpu::testing {

inline std::vector<codec::Policy> GridPolicies() {
  std::vector<codec::Policy> out;
  codec::Policy p;
  p.mode = codec::Mode::kLossless;
  out.push_back(p);
  for (auto [r, a] : {std::pair{7, -16}, {0, -1}, {3, -8}, {10, -24}, {23, -128}, {2, 0}}) {
    p.mode = codec::Mode::kNearLossless;
    p.rel_bits = r;
    p.abs_log2 = a;
    out.push_back(p);
  }
  return out;
}

// The CPU encoder's block for what the GPU encoder writes: without the trimmed form of
// lossless blocks (docs/FORMAT.md), which the GPU encoder does not make.
inline absl::Status CpuBlockAsGpuWrites(codec::DType dtype, const void* data, size_t n,
                                        const codec::Policy& policy, std::string* out) {
  codec::BlockEncodeOptions options;
  options.policy = policy;
  options.trim_unused_mantissa_bits = false;
  return codec::EncodeBlock(dtype, data, n, options, out);
}

inline std::string PolicyName(const codec::Policy& p) {
  if (p.mode == codec::Mode::kLossless) return "lossless";
  return "near_R" + std::to_string(p.rel_bits) + "_A" + std::to_string(-p.abs_log2);
}

inline std::vector<size_t> GridSizes() {
  return {0, 1, 7, 63, 64, 65, 999, 1000, 1001, 5003, 16384, 100003};
}

inline constexpr int kNumPatterns = 8;  // the codec's 6, then sparse and mostly-nonzero

inline std::string GridPatternName(int p) {
  if (p < 6) return codec::testing::PatternName(static_cast<codec::testing::Pattern>(p));
  return p == 6 ? "Sparse" : "MostlyNonzero";
}

inline std::vector<uint8_t> GridValues(codec::DType dtype, int pattern, size_t n, uint32_t seed) {
  using codec::testing::Pattern;
  if (pattern < 6) {
    return codec::testing::MakeValues(dtype, static_cast<Pattern>(pattern), n, seed);
  }
  std::vector<uint8_t> v = codec::testing::MakeValues(dtype, Pattern::kGradientLike, n, seed);
  const size_t eb = codec::DTypeBytes(dtype);
  std::mt19937 rng(seed);
  const uint16_t one = dtype == codec::DType::kF16 ? 0x3c00 : 0x3f80;  // 1.0 in the 16-bit types
  for (size_t i = 0; i < n; ++i) {
    const bool keep = pattern == 6 ? rng() % 100 == 0 : rng() % 100 != 0;
    uint8_t* e = v.data() + i * eb;
    if (!keep) {
      std::memset(e, 0, eb);
    } else if (pattern == 7) {  // no zeros from the gradient pattern: 1.0 instead
      bool zero = true;
      for (size_t b = 0; b < eb; ++b) zero &= e[b] == 0;
      if (zero) {
        if (eb == 4) {
          const float f = 1.0f;
          std::memcpy(e, &f, 4);
        } else {
          std::memcpy(e, &one, 2);
        }
      }
    }
  }
  return v;
}

// Rewrites a block's checksum after the test changed its bytes (a forged block).
inline void FixChecksum(std::string* block) {
  if (block->size() < codec::kBlockHeaderBytes) return;
  uint8_t* const b = reinterpret_cast<uint8_t*>(block->data());
  const size_t header = codec::kBlockHeaderBytes;
  format::StoreBlockChecksum(
      b, XXH64(b + header, block->size() - header, format::BlockChecksumSeed(b)));
}

// The real gradients ($GCOMP_GRADIENTS_DIR) as `dtype` chunks of `chunk_elems` elements.
struct Chunk {
  std::string name;
  std::vector<uint8_t> bytes;
  size_t elements = 0;
};
inline absl::StatusOr<std::vector<Chunk>> GradientChunks(codec::DType dtype,
                                                         size_t chunk_elems) {
  absl::StatusOr<std::vector<std::string>> files = codec::testing::GradientFiles();
  if (!files.ok()) return files.status();
  std::vector<Chunk> out;
  const size_t eb = codec::DTypeBytes(dtype);
  for (const std::string& f : *files) {
    absl::StatusOr<NpyArray> a = ReadNpyF32(f);
    if (!a.ok()) return a.status();
    for (size_t lo = 0; lo < a->data.size(); lo += chunk_elems) {
      const size_t n = std::min(chunk_elems, a->data.size() - lo);
      Chunk c;
      c.name = f + "@" + std::to_string(lo);
      c.elements = n;
      c.bytes.resize(n * eb);
      codec::FromF32(dtype, a->data.data() + lo, n, c.bytes.data());
      out.push_back(std::move(c));
    }
  }
  return out;
}

}  // namespace gcomp::gpu::testing

#endif  // GCOMP_GPU_TESTING_GRID_H_
