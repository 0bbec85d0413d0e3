#include "codec/internal/bits.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace gcomp::codec::internal {
namespace {

// WordWriter must write exactly BitWriter's bytes for any sequence of widths 0..64.
TEST(Bits, WordWriterWritesBitWriterBytes) {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    const int puts = static_cast<int>(rng() % 300);
    std::vector<uint64_t> values(puts);
    std::vector<unsigned> widths(puts);
    size_t bits = 0;
    for (int i = 0; i < puts; ++i) {
      // Mostly small widths, with 0, 63 and 64 common enough to matter.
      const unsigned pick = static_cast<unsigned>(rng() % 8);
      widths[i] = pick == 0 ? 0 : pick == 1 ? 64 : pick == 2 ? 63 : rng() % 65;
      values[i] = widths[i] == 64 ? rng() : rng() & ((uint64_t{1} << widths[i]) - 1);
      bits += widths[i];
    }
    std::vector<uint8_t> a(bits / 8 + 16, 0xcd), b(bits / 8 + 16, 0xcd);
    BitWriter bw(a.data());
    for (int i = 0; i < puts; ++i) {
      // BitWriter takes at most 56 bits between flushes: split wide values.
      const unsigned lo = widths[i] > 32 ? 32 : widths[i];
      bw.Put(values[i] & ((uint64_t{1} << lo) - 1), lo);
      bw.Flush();
      bw.Put(lo == 64 ? 0 : values[i] >> lo, widths[i] - lo);
      bw.Flush();
    }
    WordWriter ww(b.data());
    for (int i = 0; i < puts; ++i) ww.Put(values[i], widths[i]);
    const size_t na = bw.Finish(), nb = ww.Finish();
    ASSERT_EQ(na, (bits + 7) / 8);
    ASSERT_EQ(nb, na) << "trial " << trial;
    ASSERT_TRUE(std::equal(a.begin(), a.begin() + na, b.begin())) << "trial " << trial;
  }
}

}  // namespace
}  // namespace gcomp::codec::internal
