// A fixed set of threads running closures in FIFO order. Thread-safe. The destructor
// runs every closure already scheduled, then joins.
#ifndef GCOMP_SERVER_THREAD_POOL_H_
#define GCOMP_SERVER_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gcomp::server {

class ThreadPool {
 public:
  // Requires threads >= 1.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> fn);
  // Runs fn on the pool and waits for it.
  void Run(const std::function<void()>& fn);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // constant after construction
};

}  // namespace gcomp::server

#endif  // GCOMP_SERVER_THREAD_POOL_H_
