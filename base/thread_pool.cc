#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <utility>

namespace gcomp {

ThreadPool::ThreadPool(int threads) {
  workers_.reserve(std::max(threads, 0));
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::HardwareThreads() {
  return std::max(1u, std::thread::hardware_concurrency());
}

void ThreadPool::Schedule(std::function<void()> fn) {
  if (workers_.empty()) {
    fn();
    return;
  }
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void ThreadPool::ParallelFor(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  if (n == 1 || workers_.empty()) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Helpers may start after the caller returned (queued behind other work); they then find
  // no index left and touch only this shared state, never `fn`.
  struct State {
    std::atomic<size_t> next{0};
    absl::Mutex mu;
    size_t done ABSL_GUARDED_BY(mu) = 0;
  };
  auto state = std::make_shared<State>();
  auto work = [state, n, fnp = &fn] {
    size_t finished = 0;
    for (size_t i; (i = state->next.fetch_add(1)) < n;) {
      (*fnp)(i);
      ++finished;
    }
    if (finished > 0) {
      absl::MutexLock lock(&state->mu);
      state->done += finished;
    }
  };
  const size_t helpers = std::min(n - 1, workers_.size());
  for (size_t h = 0; h < helpers; ++h) Schedule(work);
  work();
  absl::MutexLock lock(&state->mu);
  auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state->mu) { return state->done == n; };
  state->mu.Await(absl::Condition(&all_done));
}

}  // namespace gcomp
