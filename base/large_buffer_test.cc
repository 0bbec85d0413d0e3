#include "base/large_buffer.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(LargeBuffer, SmallRequestsAreOrdinaryAlignedMemory) {
  LargeBuffer b;
  EXPECT_EQ(b.data(), nullptr);
  uint8_t* p = b.Reserve(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_FALSE(b.mapped());
  EXPECT_GE(b.capacity(), 1000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  std::memset(p, 0x5A, 1000);
  EXPECT_EQ(b.Reserve(500), p) << "a smaller request keeps the memory";
  EXPECT_EQ(p[999], 0x5A);
}

TEST(LargeBuffer, MegabytesAreWholeAlignedHugePages) {
  LargeBuffer b;
  const size_t want = 3 * LargeBuffer::kHugeBytes + 12345;
  uint8_t* p = b.Reserve(want);
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(b.mapped());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), 0u);
  EXPECT_EQ(b.capacity() % (size_t{2} << 20), 0u);
  EXPECT_GE(b.capacity(), want);
  // Every byte of the capacity is writable and keeps what was written.
  for (size_t i = 0; i < b.capacity(); i += 4096) p[i] = static_cast<uint8_t>(i >> 12);
  p[b.capacity() - 1] = 0xEE;
  for (size_t i = 0; i < b.capacity(); i += 4096) {
    ASSERT_EQ(p[i], static_cast<uint8_t>(i >> 12)) << i;
  }
  EXPECT_EQ(p[b.capacity() - 1], 0xEE);
}

TEST(LargeBuffer, GrowsFromSmallToMappedAndMoves) {
  LargeBuffer a;
  a.Reserve(64);
  EXPECT_FALSE(a.mapped());
  uint8_t* big = a.Reserve(LargeBuffer::kHugeBytes);
  EXPECT_TRUE(a.mapped());
  big[LargeBuffer::kHugeBytes - 1] = 7;
  LargeBuffer b(std::move(a));
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.capacity(), 0u);
  EXPECT_EQ(b.data(), big);
  EXPECT_EQ(b.data()[LargeBuffer::kHugeBytes - 1], 7);
  LargeBuffer c;
  c.Reserve(100);
  c = std::move(b);
  EXPECT_EQ(c.data(), big);
  EXPECT_TRUE(c.mapped());
  // Growing a mapped buffer past its capacity gives a new, larger one.
  uint8_t* bigger = c.Reserve(c.capacity() + 1);
  EXPECT_GE(c.capacity(), 2 * LargeBuffer::kHugeBytes + 1);
  bigger[c.capacity() - 1] = 1;
}

}  // namespace
}  // namespace gcomp
