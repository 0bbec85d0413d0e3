// Runs every closure at once on a thread of its own, reusing threads that are done with
// earlier closures instead of starting one per closure.
//
// Unlike ThreadPool, Run never queues a closure behind others: when no parked thread is
// free it starts a new one. Callers whose closures block on each other (a push waiting for
// a shard that waits for another push of the same caller) keep the progress guarantee of
// one thread per closure, and a steady workload starts no threads after warm-up.
#ifndef GCOMP_BASE_THREAD_CACHE_H_
#define GCOMP_BASE_THREAD_CACHE_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gcomp {

// Thread-safe. Threads stay parked until destruction, so the number of threads is the
// most closures that ever ran at once. The destructor waits for running closures, then
// joins every thread.
class ThreadCache {
 public:
  ThreadCache() = default;
  ~ThreadCache();
  ThreadCache(const ThreadCache&) = delete;
  ThreadCache& operator=(const ThreadCache&) = delete;

  // Runs `fn` on a thread, then `then` (if any) once that thread is free for the next
  // closure. Signal completion from `then`: a caller that waits for it and runs more
  // closures finds the thread parked, instead of racing its way back and starting another.
  void Run(std::function<void()> fn, std::function<void()> then = nullptr);

  // Threads started so far.
  int threads() const;

 private:
  struct Work {
    std::function<void()> fn;
    std::function<void()> then;
  };
  void Loop(Work first);

  mutable absl::Mutex mu_;
  std::deque<Work> handed_ ABSL_GUARDED_BY(mu_);  // for parked threads
  int parked_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gcomp

#endif  // GCOMP_BASE_THREAD_CACHE_H_
