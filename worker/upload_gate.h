// Which of one push-pull's calls may be sending its request: at most `limit` at once, first
// attempts in chunk order. The shard answers a chunk only once every worker pushed it, so
// calls that upload side by side (HTTP/2 interleaves them) all finish arriving, and get
// their replies, at about the same time, while the worker's uplink idles. Uploading one
// chunk after another lets each reply come down while the next chunks go up.
//
// Chunk c's first Enter waits until chunks 0..c-1 have entered (the caller takes chunks
// in order, so each of them is held by a caller on its way here or has entered); a later
// Enter of the same chunk (a retry) waits only for a free slot. Open lets everyone through
// for good: a failed push-pull must not leave a caller waiting for a chunk no one will send.
// Thread-safe.
#ifndef GCOMP_WORKER_UPLOAD_GATE_H_
#define GCOMP_WORKER_UPLOAD_GATE_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace gcomp::worker {

class UploadGate {
 public:
  // limit >= 1 (0 reads as 1).
  explicit UploadGate(uint32_t limit) : limit_(limit < 1 ? 1 : limit) {}

  UploadGate(const UploadGate&) = delete;
  UploadGate& operator=(const UploadGate&) = delete;

  // One caller's turn to upload; gives its slot back on Release or destruction.
  class Slot {
   public:
    Slot(Slot&& other) noexcept : gate_(other.gate_) { other.gate_ = nullptr; }
    Slot& operator=(Slot&&) = delete;
    Slot(const Slot&) = delete;
    Slot& operator=(const Slot&) = delete;
    ~Slot() { Release(); }

    // Idempotent: the request is out (or its call ended).
    void Release() {
      if (gate_ != nullptr) gate_->Leave();
      gate_ = nullptr;
    }

   private:
    friend class UploadGate;
    explicit Slot(UploadGate* gate) : gate_(gate) {}
    UploadGate* gate_;  // null once released, or when the gate was open
  };

  // Waits for `chunk`'s turn and a free slot.
  Slot Enter(uint32_t chunk) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto turn = [this, chunk]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return open_ || (uploading_ < limit_ && chunk <= next_chunk_);
    };
    mu_.Await(absl::Condition(&turn));
    if (chunk == next_chunk_) ++next_chunk_;
    if (open_) return Slot(nullptr);
    ++uploading_;
    return Slot(this);
  }

  // Everyone passes from now on, without a slot.
  void Open() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    open_ = true;
  }

 private:
  void Leave() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    --uploading_;
  }

  absl::Mutex mu_;
  const uint32_t limit_;
  uint32_t uploading_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t next_chunk_ ABSL_GUARDED_BY(mu_) = 0;  // lowest chunk whose first Enter is to come
  bool open_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace gcomp::worker

#endif  // GCOMP_WORKER_UPLOAD_GATE_H_
