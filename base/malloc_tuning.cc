#include "base/malloc_tuning.h"

#include <malloc.h>

namespace gcomp {

void TuneMallocForLargeBuffers() {
  mallopt(M_MMAP_THRESHOLD, 64 << 20);  // blocks below 64 MiB come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // and stay there between steps
}

}  // namespace gcomp
