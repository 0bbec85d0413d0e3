#include "base/malloc_tuning.h"

#include <malloc.h>

#include <cstring>
#include <memory>

#include "gtest/gtest.h"

namespace gcomp {
namespace {

TEST(TuneMallocForLargeBuffers, MegabyteBlocksComeFromTheHeapNotMmap) {
  TuneMallocForLargeBuffers();
  const size_t mmapped_before = mallinfo2().hblks;
  auto block = std::make_unique<char[]>(8 << 20);
  std::memset(block.get(), 1, 8 << 20);
  // Without the tuning glibc serves an 8 MiB request with its own mmap (hblks + 1).
  EXPECT_EQ(mallinfo2().hblks, mmapped_before);
}

}  // namespace
}  // namespace gcomp
