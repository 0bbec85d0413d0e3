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

void ThreadCache::Run(std::function<void()> fn, std::function<void()> then) {
  Work work{std::move(fn), std::move(then)};
  absl::MutexLock lock(&mu_);
  // A parked thread that has not been handed a closure yet takes this one.
  if (parked_ > static_cast<int>(handed_.size())) {
    handed_.push_back(std::move(work));
    return;
  }
  threads_.emplace_back([this, first = std::move(work)]() mutable { Loop(std::move(first)); });
}

int ThreadCache::threads() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(threads_.size());
}

void ThreadCache::Loop(Work first) {
  Work work = std::move(first);
  while (true) {
    work.fn();
    std::function<void()> then = std::move(work.then);
    work = Work();
    mu_.Lock();
    ++parked_;
    if (then) {
      mu_.Unlock();
      then();
      then = nullptr;
      mu_.Lock();
    }
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || !handed_.empty();
    };
    mu_.Await(absl::Condition(&ready));
    --parked_;
    if (handed_.empty()) {  // stopping, nothing left to run
      mu_.Unlock();
      return;
    }
    work = std::move(handed_.front());
    handed_.pop_front();
    mu_.Unlock();
  }
}

}  // namespace gcomp
