#include "base/malloc_tuning.h"

#include <malloc.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/process_usage.h"
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

// Many allocating threads share at most two arenas (each arena keeps its own high-water
// mark, which made long runs grow).
TEST(TuneMallocForLargeBuffers, ThreadsShareAtMostTwoArenas) {
  TuneMallocForLargeBuffers();
  std::vector<std::thread> threads;
  std::vector<void*> held(8, nullptr);
  std::atomic<int> allocated{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&held, &allocated, i] {
      held[i] = malloc(100000);
      std::memset(held[i], 1, 100000);
      ++allocated;
      // All eight live at once, so that without a cap glibc would give them more arenas.
      while (allocated < 8) std::this_thread::yield();
    });
  }
  for (std::thread& t : threads) t.join();
  char* text = nullptr;
  size_t size = 0;
  FILE* out = open_memstream(&text, &size);
  ASSERT_EQ(malloc_info(0, out), 0);
  fclose(out);
  const std::string info(text, size);
  free(text);
  for (void* p : held) free(p);
  int heaps = 0;
  for (size_t at = info.find("<heap nr="); at != std::string::npos; at = info.find("<heap nr=", at + 1)) {
    ++heaps;
  }
  EXPECT_GE(heaps, 1);
  EXPECT_LE(heaps, 2) << info;
}

// Free holes in the middle of the heap (pinned by small live blocks above them) stay
// resident under TuneMallocForLargeBuffers until the periodic trim hands them back.
TEST(PeriodicMallocTrim, ReturnsFreeHeapPagesToTheKernel) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator replaces glibc's heap; malloc_trim has no effect";
#endif
  TuneMallocForLargeBuffers();
  std::vector<char*> big, pins;
  for (int i = 0; i < 64; ++i) {
    big.push_back(static_cast<char*>(malloc(1 << 20)));
    std::memset(big.back(), 1, 1 << 20);
    pins.push_back(static_cast<char*>(malloc(64)));  // keeps the hole from the heap's top
  }
  for (char* b : big) free(b);
  const uint64_t before = ReadProcessUsage(getpid())->rss_bytes;
  uint64_t after = before;
  {
    PeriodicMallocTrim trim(absl::Milliseconds(10));
    // Wait for a trim, however loaded the machine is (at most 10 s).
    for (int i = 0; i < 200 && after + (32u << 20) >= before; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
      after = ReadProcessUsage(getpid())->rss_bytes;
    }
  }
  for (char* p : pins) free(p);
  EXPECT_LT(after + (32u << 20), before) << "before " << before << " after " << after;
}

}  // namespace
}  // namespace gcomp
