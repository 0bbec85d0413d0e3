// One object of type T per thread, handed on to a later thread when its thread exits.
#ifndef GCOMP_BASE_REUSED_PER_THREAD_H_
#define GCOMP_BASE_REUSED_PER_THREAD_H_

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gcomp {

// Like a `thread_local T`, but a thread that exits leaves its object in a process-wide
// free list (at most kKeep of them) and the next thread to start using one takes it from
// there instead of making a new one.
//
// Why: scratch memory held per thread (a codec block being assembled, megabytes in huge
// pages) is cheap to reuse and dear to make, since every fresh page is zeroed by the kernel
// on first touch. gRPC's synchronous server starts and ends threads as its load moves, so
// a shard that encoded on its request threads with plain thread_locals paid for fresh
// scratch many times a step (docs/BENCHMARKS.md, "Scratch that outlives its thread").
//
// Every use with one T shares the object: give each use a T of its own (a small struct
// around the buffer it keeps). Get() is thread-safe; the object it returns belongs to the
// calling thread until that thread exits. T must be default-constructible; objects handed
// on keep whatever state their last thread left, so T must be fine with that (scratch is).
template <typename T, size_t kKeep = 16>
class ReusedPerThread {
 public:
  static T& Get() {
    thread_local Holder holder;
    return *holder.object;
  }

  // Objects waiting in the free list now (for tests).
  static size_t Waiting() {
    FreeList& list = List();
    absl::MutexLock lock(&list.mu);
    return list.objects.size();
  }

 private:
  struct FreeList {
    absl::Mutex mu;
    std::vector<std::unique_ptr<T>> objects ABSL_GUARDED_BY(mu);
  };
  // Never destroyed: threads may exit (and hand objects back) after static destructors ran.
  static FreeList& List() {
    static FreeList* list = new FreeList;
    return *list;
  }

  struct Holder {
    std::unique_ptr<T> object;
    Holder() {
      FreeList& list = List();
      {
        absl::MutexLock lock(&list.mu);
        if (!list.objects.empty()) {
          object = std::move(list.objects.back());
          list.objects.pop_back();
        }
      }
      if (object == nullptr) object = std::make_unique<T>();
    }
    ~Holder() {
      FreeList& list = List();
      absl::MutexLock lock(&list.mu);
      if (list.objects.size() < kKeep) list.objects.push_back(std::move(object));
    }
  };
};

}  // namespace gcomp

#endif  // GCOMP_BASE_REUSED_PER_THREAD_H_
