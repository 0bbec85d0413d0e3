// A bounded hand-off between one producer and a few consumers that can fail as a whole:
// one push-pull call's encoder thread pushes encoded chunks, its sender threads pop them.
// Push waits while `capacity` items are queued (so encoding runs at most that far ahead of
// the network); Pop waits for an item and returns nothing once the queue is closed and
// drained or failed. The first Fail wins, wakes every waiter and drops what is queued.
#ifndef GCOMP_WORKER_BOUNDED_QUEUE_H_
#define GCOMP_WORKER_BOUNDED_QUEUE_H_

#include <atomic>
#include <cstddef>
#include <deque>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gcomp::worker {

template <typename T>
class BoundedQueue {
 public:
  // capacity >= 1.
  explicit BoundedQueue(size_t capacity) : capacity_(capacity < 1 ? 1 : capacity) {}

  BoundedQueue(const BoundedQueue&) = delete;
  BoundedQueue& operator=(const BoundedQueue&) = delete;

  // Waits for room; false (and `item` dropped) if the queue failed meanwhile.
  bool Push(T item) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return items_.size() < capacity_ || !error_.ok();
    };
    mu_.Await(absl::Condition(&room));
    if (!error_.ok()) return false;
    items_.push_back(std::move(item));
    return true;
  }

  // The next item; nullopt once closed and empty, or failed.
  std::optional<T> Pop() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !items_.empty() || closed_ || !error_.ok();
    };
    mu_.Await(absl::Condition(&ready));
    if (!error_.ok() || items_.empty()) return std::nullopt;
    T item = std::move(items_.front());
    items_.pop_front();
    return item;
  }

  // No more pushes: consumers drain what is queued, then Pop returns nullopt.
  void Close() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  // Fails the queue with `status` (not OK) unless it failed already.
  void Fail(absl::Status status) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (!error_.ok() || status.ok()) return;
    error_ = std::move(status);
    items_.clear();
    failed_.store(true, std::memory_order_release);
  }

  // Cheap check for a producer's loop.
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // The first failure, or OK.
  absl::Status status() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<T> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> failed_{false};
};

}  // namespace gcomp::worker

#endif  // GCOMP_WORKER_BOUNDED_QUEUE_H_
