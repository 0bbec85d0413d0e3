// A fixed-size pool of worker threads with a blocking ParallelFor.
#ifndef GCOMP_BASE_THREAD_POOL_H_
#define GCOMP_BASE_THREAD_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gcomp {

// Runs scheduled closures on `threads` worker threads. Thread-safe. The destructor runs every
// closure already scheduled, then joins the workers.
class ThreadPool {
 public:
  // Requires threads >= 0; with 0 workers, ParallelFor runs on the calling thread and
  // Schedule runs the closure inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> fn);

  // Runs fn(i) for every i in [0, n) on the workers and the calling thread; returns when all
  // calls have returned. Safe to call from a worker of this pool (it never waits on queued
  // work, only on calls already running).
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

  // Worker threads (not counting callers of ParallelFor).
  int size() const { return static_cast<int>(workers_.size()); }

  // std::thread::hardware_concurrency(), at least 1.
  static int HardwareThreads();

 private:
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // constant after construction
};

}  // namespace gcomp

#endif  // GCOMP_BASE_THREAD_POOL_H_
