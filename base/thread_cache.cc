#include "base/thread_cache.h"

#include <utility>

namespace gcomp {

ThreadCache::~ThreadCache() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

void ThreadCache::Run(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  // A parked thread that has not been handed a closure yet takes this one.
  if (parked_ > static_cast<int>(handed_.size())) {
    handed_.push_back(std::move(fn));
    return;
  }
  threads_.emplace_back([this, first = std::move(fn)]() mutable { Loop(std::move(first)); });
}

int ThreadCache::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

void ThreadCache::Loop(std::function<void()> first) {
  std::function<void()> fn = std::move(first);
  while (true) {
    fn();
    fn = nullptr;
    absl::MutexLock lock(&mu_);
    ++parked_;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !handed_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    --parked_;
    if (handed_.empty()) return;  // stopping, nothing left to run
    fn = std::move(handed_.front());
    handed_.pop_front();
  }
}

}  // namespace gcomp
