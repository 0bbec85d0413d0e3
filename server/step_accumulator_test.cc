#include "server/step_accumulator.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace gcomp::server {
namespace {

using ::testing::HasSubstr;

// Replies carry the value as raw floats so tests can read them back.
StepAccumulator::Finalizer RawFinalizer() {
  return [](int64_t step, absl::Span<const float> v)
             -> absl::StatusOr<std::shared_ptr<const proto::CompressedBlock>> {
    auto b = std::make_shared<proto::CompressedBlock>();
    b->mutable_address()->set_step(step);
    b->set_data(std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4));
    return std::shared_ptr<const proto::CompressedBlock>(b);
  };
}

std::vector<float> Values(const proto::CompressedBlock& b) {
  std::vector<float> v(b.data().size() / 4);
  if (!v.empty()) std::memcpy(v.data(), b.data().data(), b.data().size());  // no null memcpy
  return v;
}

std::unique_ptr<StepAccumulator> Make(uint32_t workers, size_t n,
                                      absl::Duration timeout = absl::Seconds(10)) {
  StepAccumulatorOptions o;
  o.workers = workers;
  o.step_timeout = timeout;
  o.label = "key 'w' chunk 0";
  return std::make_unique<StepAccumulator>(o, cluster::Optimizer({}, n), RawFinalizer(),
                                           [](uint32_t w) { return absl::StrCat("worker-", w); });
}

TEST(StepAccumulator, AveragesInWorkerOrder) {
  auto acc = Make(3, 2);
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> got(3);
  for (uint32_t w = 0; w < 3; ++w) {
    threads.emplace_back([&, w] {
      auto r = acc->Push(w, 0, {float(w + 1), -float(w)}, absl::InfiniteFuture());
      ASSERT_TRUE(r.ok()) << r.status();
      got[w] = Values(*r->reply);
    });
  }
  for (auto& t : threads) t.join();
  for (uint32_t w = 0; w < 3; ++w) {
    EXPECT_EQ(got[w], (std::vector<float>{2.0f, -1.0f}));
  }
  EXPECT_EQ(acc->steps_completed(), 1u);
}

// Pushes `c` (one vector per worker) as step `step`, worker order[0] first: each push goes
// in only once the one before it has arrived. Returns the reply's values.
std::vector<float> PushInOrder(StepAccumulator& acc, int64_t step,
                               const std::vector<std::vector<float>>& c,
                               const std::vector<uint32_t>& order) {
  std::vector<std::thread> threads;
  std::vector<std::vector<float>> got(c.size());
  std::atomic<bool> failed{false};
  for (uint32_t w : order) {
    threads.emplace_back([&, w] {
      auto r = acc.Push(w, step, c[w], absl::InfiniteFuture());
      if (!r.ok()) failed = true;
      ASSERT_TRUE(r.ok()) << r.status();
      got[w] = Values(*r->reply);
    });
    while (!failed) {  // until it is in (a duplicate now), or the step completed
      absl::StatusOr<bool> duplicate = acc.Admit(w, step);
      if (!duplicate.ok() || *duplicate) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  for (auto& t : threads) t.join();
  for (const auto& g : got) EXPECT_EQ(g.size(), got[0].size());
  return got[0];
}

// Whatever order the pushes arrive in, the mean is the plain loop's, bit for bit: the sum
// in worker order, then the division (whole tiles and a tail, specials too, and several
// steps on one accumulator, so a step starts its sum afresh).
TEST(StepAccumulator, MeanBitIdenticalToSummingInWorkerOrder) {
  uint32_t seed = 12345;
  auto next = [&seed] {
    seed = seed * 1664525u + 1013904223u;
    return seed;
  };
  for (uint32_t workers : {1, 2, 3, 4, 5, 8}) {
    for (size_t n : {0, 1, 7, 2047, 2048, 2049, 6000}) {
      auto acc = Make(workers, n);
      std::vector<uint32_t> order(workers);
      for (uint32_t w = 0; w < workers; ++w) order[w] = w;
      for (int64_t step = 0; step < 3; ++step) {
        // Step 0 in worker order, step 1 reversed, step 2 shuffled.
        if (step == 1) std::reverse(order.begin(), order.end());
        if (step == 2) {
          for (uint32_t i = workers; i > 1; --i) std::swap(order[i - 1], order[next() % i]);
        }
        std::vector<std::vector<float>> c(workers, std::vector<float>(n));
        for (auto& v : c) {
          for (float& x : v) {
            const uint32_t bits = next();
            // Mostly gradient-like values of mixed scale, some raw bit patterns (NaN, Inf,
            // subnormals, -0).
            if (bits % 16 == 0) {
              std::memcpy(&x, &bits, 4);
            } else {
              x = std::ldexp(static_cast<float>(static_cast<int32_t>(next())) / 2147483648.0f,
                             static_cast<int>(bits % 40) - 30);
            }
          }
        }
        std::vector<float> want = c[0];
        for (size_t w = 1; w < workers; ++w) {
          for (size_t i = 0; i < n; ++i) want[i] += c[w][i];
        }
        for (size_t i = 0; i < n; ++i) {
          want[i] = (workers & (workers - 1)) == 0 ? want[i] * (1.0f / workers)
                                                   : want[i] / static_cast<float>(workers);
        }
        const std::vector<float> got = PushInOrder(*acc, step, c, order);
        ASSERT_EQ(got.size(), n);
        for (size_t i = 0; i < n; ++i) {
          // Which NaN an add of two NaNs keeps is the compiler's choice of operand order.
          if (std::isnan(want[i])) {
            ASSERT_TRUE(std::isnan(got[i]))
                << "workers " << workers << " n " << n << " step " << step << " i " << i;
          } else {
            ASSERT_EQ(std::memcmp(&got[i], &want[i], 4), 0)
                << "workers " << workers << " n " << n << " step " << step << " i " << i << ": "
                << got[i] << " != " << want[i];
          }
        }
      }
    }
  }
}

TEST(StepAccumulator, DuplicatePushIsCountedOnce) {
  auto acc = Make(2, 1);
  std::thread first([&] { (void)acc->Push(0, 0, {10}, absl::InfiniteFuture()); });
  // A retry of worker 0 while the step is open: waits for the same result. It goes in once
  // the first push is in (Admit says duplicate), not after a fixed sleep: on a loaded
  // machine the first thread may not have run yet, and an empty push is then no retry.
  std::thread retry([&] {
    for (;;) {
      absl::StatusOr<bool> duplicate = acc->Admit(0, 0);
      if (!duplicate.ok() || *duplicate) break;  // in, or the step already completed
      absl::SleepFor(absl::Milliseconds(1));
    }
    auto r = acc->Push(0, 0, {}, absl::InfiniteFuture());
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(Values(*r->reply)[0], 6.0f);
  });
  absl::SleepFor(absl::Milliseconds(50));
  auto r = acc->Push(1, 0, {2}, absl::InfiniteFuture());
  first.join();
  retry.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Values(*r->reply)[0], 6.0f);  // (10 + 2) / 2, not (10 + 10 + 2) / 2
  // A retry after completion gets the cached result.
  auto again = acc->Push(1, 0, {999}, absl::InfiniteFuture());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->duplicate);
  EXPECT_EQ(Values(*again->reply)[0], 6.0f);
}

TEST(StepAccumulator, StaleAndFutureStepsAreRejectedWithoutChange) {
  auto acc = Make(1, 1);
  ASSERT_TRUE(acc->Push(0, 5, {1}, absl::InfiniteFuture()).ok());
  ASSERT_TRUE(acc->Push(0, 6, {2}, absl::InfiniteFuture()).ok());
  EXPECT_EQ(acc->Admit(0, 4).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(acc->Push(0, 4, {3}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto future = acc->Push(0, 9, {3}, absl::InfiniteFuture());
  EXPECT_EQ(future.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(future.status().message()), HasSubstr("future step 9"));
  auto r = acc->Push(0, 7, {4}, absl::InfiniteFuture());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Values(*r->reply)[0], 4.0f);
  EXPECT_EQ(acc->steps_completed(), 3u);
}

// A stray first push far ahead fails at the step timeout and leaves the chunk free to start
// at the job's real first step; once a step has completed, the chunk keeps its place.
TEST(StepAccumulator, AFailedFirstStepDoesNotPinTheChunk) {
  auto acc = Make(2, 1, absl::Milliseconds(50));
  auto stray = acc->Push(0, (int64_t{1} << 62) - 1, {5.0f}, absl::InfiniteFuture());
  EXPECT_EQ(stray.status().code(), absl::StatusCode::kDeadlineExceeded);
  for (int64_t step : {0, 1}) {
    std::thread other(
        [&] { ASSERT_TRUE(acc->Push(1, step, {3.0f}, absl::InfiniteFuture()).ok()); });
    auto r = acc->Push(0, step, {1.0f}, absl::InfiniteFuture());
    other.join();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Values(*r->reply), std::vector<float>{2.0f});
  }
  // Step 2 fails the same way; the chunk stays at it rather than restart anywhere.
  EXPECT_EQ(acc->Push(0, 2, {1.0f}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(acc->Push(0, 0, {1.0f}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Found by the shard_service fuzz target: a first push at step 2^63 - 1 overflowed the
// step counter when the step completed.
TEST(StepAccumulator, StepsOutsideTheRangeAreRefusedWithoutChange) {
  auto acc = Make(1, 1);
  for (int64_t step : {int64_t{-1}, kMaxStep, std::numeric_limits<int64_t>::max()}) {
    auto r = acc->Push(0, step, {1}, absl::InfiniteFuture());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << step;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("out of range")) << step;
    EXPECT_EQ(acc->Admit(0, step).status().code(), absl::StatusCode::kInvalidArgument) << step;
  }
  EXPECT_EQ(acc->steps_completed(), 0u);
  auto last = acc->Push(0, kMaxStep - 1, {3}, absl::InfiniteFuture());
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(Values(*last->reply)[0], 3.0f);
  EXPECT_EQ(acc->Push(0, kMaxStep, {4}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(StepAccumulator, TimeoutNamesMissingWorkersForEveryWaiter) {
  // Long enough for the second push to arrive within it even under TSan on a loaded
  // machine (100 ms was not: worker 1's push came after the step had failed).
  auto acc = Make(3, 1, absl::Seconds(1));
  absl::Status s0, s1;
  std::thread t0([&] { s0 = acc->Push(0, 0, {1}, absl::InfiniteFuture()).status(); });
  std::thread t1([&] { s1 = acc->Push(1, 0, {1}, absl::InfiniteFuture()).status(); });
  t0.join();
  t1.join();
  for (const absl::Status& s : {s0, s1}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
    EXPECT_THAT(std::string(s.message()), HasSubstr("missing workers: worker-2 (every worker"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("one of another shape pushes other keys"));
  }
  EXPECT_EQ(acc->steps_failed(), 1u);
  // The step can be pushed again afterwards.
  std::thread a([&] { EXPECT_TRUE(acc->Push(0, 0, {3}, absl::InfiniteFuture()).ok()); });
  std::thread b([&] { EXPECT_TRUE(acc->Push(1, 0, {3}, absl::InfiniteFuture()).ok()); });
  auto r = acc->Push(2, 0, {3}, absl::InfiniteFuture());
  a.join();
  b.join();
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Values(*r->reply)[0], 3.0f);
}

// Peers choose worker names, and every waiting worker receives the list (gRPC clients refuse
// a status over 8 KiB) and every chunk keeps it: a few names, each clipped, then a count.
TEST(StepAccumulator, TheMissingWorkerListIsBounded) {
  StepAccumulatorOptions o;
  o.workers = 1000;
  o.step_timeout = absl::Milliseconds(50);
  o.label = "key 'w' chunk 0";
  StepAccumulator acc(o, cluster::Optimizer({}, 1), RawFinalizer(), [](uint32_t w) {
    return absl::StrCat(std::string(2000, w % 2 ? 'x' : '\xe2'), w);  // invalid UTF-8 too
  });
  const absl::Status s = acc.Push(0, 0, {1}, absl::InfiniteFuture()).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_LT(s.message().size(), 1200u) << s.message().size();
  EXPECT_THAT(std::string(s.message()), HasSubstr("... (2001 bytes), "));
  EXPECT_THAT(std::string(s.message()), HasSubstr(" and 991 more (999 of 1000 workers missing)"));
}

TEST(StepAccumulator, CallerDeadlineKeepsTheContribution) {
  auto acc = Make(2, 1);
  auto early = acc->Push(0, 0, {4}, absl::Now() + absl::Milliseconds(20));
  EXPECT_EQ(early.status().code(), absl::StatusCode::kDeadlineExceeded);
  auto r = acc->Push(1, 0, {2}, absl::InfiniteFuture());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Values(*r->reply)[0], 3.0f);
}

// A call check that turns to an error ends the wait within kCallCheckEvery, with that
// error, and the contribution stays: the step completes with it.
TEST(StepAccumulator, ACallCheckEndsTheWaitAndKeepsTheContribution) {
  auto acc = Make(2, 1);
  std::atomic<bool> valid{true};
  StepAccumulator::CallCheck check = [&]() -> absl::Status {
    if (valid.load()) return absl::OkStatus();
    return absl::AlreadyExistsError("superseded");
  };
  absl::StatusOr<StepAccumulator::Outcome> first;
  absl::Duration waited;
  std::thread t([&] {
    const absl::Time start = absl::Now();
    first = acc->Push(0, 0, {2.0f}, absl::InfiniteFuture(), check);
    waited = absl::Now() - start;
  });
  absl::SleepFor(absl::Milliseconds(100));
  valid = false;
  t.join();
  EXPECT_EQ(first.status().code(), absl::StatusCode::kAlreadyExists) << first.status();
  EXPECT_LT(waited, absl::Seconds(10));  // without the check: forever
  auto r = acc->Push(1, 0, {4.0f}, absl::InfiniteFuture());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Values(*r->reply), std::vector<float>{3.0f});
}

// A step nobody waits on (its pushers' calls ended early) still times out: the next push
// ends it. A stray first push far ahead then no longer pins a fresh chunk.
TEST(StepAccumulator, AStepNobodyWaitsOnTimesOutAtTheNextPush) {
  // The step timeout leaves the pushes that complete a step time to meet under load.
  auto acc = Make(2, 1, absl::Milliseconds(500));
  auto stray = acc->Push(1, 1000000, {9.0f}, absl::Now() + absl::Milliseconds(1));
  EXPECT_EQ(stray.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(acc->Admit(0, 0).status().code(), absl::StatusCode::kFailedPrecondition);
  absl::SleepFor(absl::Milliseconds(600));
  ASSERT_TRUE(acc->Admit(0, 0).ok());  // the stray step timed out: step 0 may start
  EXPECT_EQ(acc->steps_failed(), 1u);
  std::thread other([&] {
    auto r = acc->Push(1, 0, {4.0f}, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Values(*r->reply), std::vector<float>{3.0f});
  });
  auto r = acc->Push(0, 0, {2.0f}, absl::Now() + absl::Seconds(10));
  other.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Values(*r->reply), std::vector<float>{3.0f});  // the stray 9 is gone

  // The same within a started chunk: worker 0's push of step 1 left behind, then worker 1
  // comes after the timeout: the old contribution is dropped, both push again.
  EXPECT_EQ(acc->Push(0, 1, {100.0f}, absl::Now() + absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  absl::SleepFor(absl::Milliseconds(600));
  std::thread late([&] {
    auto again = acc->Push(1, 1, {6.0f}, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(Values(*again->reply), std::vector<float>{5.0f});
  });
  absl::SleepFor(absl::Milliseconds(20));
  auto mine = acc->Push(0, 1, {4.0f}, absl::Now() + absl::Seconds(10));
  late.join();
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(acc->steps_failed(), 2u);
}

// A retry admitted as a duplicate (so not decoded) whose step times out before it reaches
// Push gets the timeout, as a waiter of that step would, and resends.
TEST(StepAccumulator, ADuplicateWhoseStepTimedOutMeanwhileGetsTheTimeout) {
  auto acc = Make(2, 1, absl::Milliseconds(100));
  EXPECT_EQ(acc->Push(0, 0, {1.0f}, absl::Now() + absl::Milliseconds(1)).status().code(),
            absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(*acc->Admit(0, 0));  // a duplicate: the caller skips decoding
  absl::SleepFor(absl::Milliseconds(200));
  auto r = acc->Push(0, 0, {}, absl::Now() + absl::Seconds(10));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("timed out"));
}

TEST(StepAccumulator, InitialValueAndCancel) {
  StepAccumulatorOptions o;
  o.label = "x";
  StepAccumulator acc(o, cluster::Optimizer({cluster::OptimizerKind::kSgd, 1.0}, 1), RawFinalizer(),
                      [](uint32_t) { return std::string("w"); });
  EXPECT_TRUE(acc.SetInitial(std::vector<float>{5}));
  EXPECT_EQ(Values(**acc.Current())[0], 5.0f);
  auto r = acc.Push(0, 0, {1}, absl::InfiniteFuture());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(Values(*r->reply)[0], 4.0f);
  EXPECT_FALSE(acc.SetInitial(std::vector<float>{5}));
  acc.Cancel(absl::UnavailableError("bye"));
  EXPECT_EQ(acc.Push(0, 1, {1}, absl::InfiniteFuture()).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(StepAccumulator, ContributionBuffersAreReusedAcrossSteps) {
  auto acc = Make(1, 1000);
  std::vector<float> first = *acc->TakeBuffer();
  ASSERT_EQ(first.size(), 1000u);
  const float* data = first.data();
  std::fill(first.begin(), first.end(), 2.0f);
  ASSERT_TRUE(acc->Push(0, 0, std::move(first), absl::InfiniteFuture()).ok());
  std::vector<float> second = *acc->TakeBuffer();  // the step's buffer, not a new one
  EXPECT_EQ(second.data(), data);
  EXPECT_EQ(second.size(), 1000u);
  std::fill(second.begin(), second.end(), 4.0f);
  auto r = acc->Push(0, 1, std::move(second), absl::InfiniteFuture());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(Values(*r->reply), std::vector<float>(1000, 4.0f));
}

TEST(StepAccumulator, DuplicateAndRejectedPushesGiveTheirBufferBack) {
  auto acc = Make(1, 8);
  ASSERT_TRUE(acc->Push(0, 0, std::vector<float>(8, 1.0f), absl::InfiniteFuture()).ok());
  for (int64_t step : {0, 5}) {  // a duplicate of the completed step, then a future step
    std::vector<float> b = *acc->TakeBuffer();
    const float* data = b.data();
    (void)acc->Push(0, step, std::move(b), absl::InfiniteFuture());
    EXPECT_EQ(acc->TakeBuffer()->data(), data) << "step " << step;
  }
}

std::unique_ptr<StepAccumulator> MakeAdmitted(Admission* admission, uint32_t workers, size_t n) {
  StepAccumulatorOptions o;
  o.workers = workers;
  o.label = "key 'w' chunk 0";
  o.admission = admission;
  return std::make_unique<StepAccumulator>(o, cluster::Optimizer({}, n), RawFinalizer(),
                                           [](uint32_t w) { return absl::StrCat("worker-", w); });
}

TEST(StepAccumulator, BuffersAndPendingStepsAreAccounted) {
  Admission admission({.memory_budget_bytes = 1 << 20});
  {
    auto acc = MakeAdmitted(&admission, 2, 100);
    std::vector<float> b0 = *acc->TakeBuffer();
    EXPECT_EQ(admission.usage().memory_bytes, 400u);
    std::fill(b0.begin(), b0.end(), 1.0f);
    std::thread first([&] {
      EXPECT_TRUE(acc->Push(0, 0, std::move(b0), absl::Now() + absl::Seconds(10)).ok());
    });
    while (admission.usage().pending_steps == 0) absl::SleepFor(absl::Milliseconds(1));
    EXPECT_EQ(admission.usage().pending_bytes, 400u);
    std::vector<float> b1 = *acc->TakeBuffer();
    EXPECT_EQ(admission.usage().memory_bytes, 800u);
    std::fill(b1.begin(), b1.end(), 3.0f);
    auto r = acc->Push(1, 0, std::move(b1), absl::Now() + absl::Seconds(10));
    first.join();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Values(*r->reply), std::vector<float>(100, 2.0f));
    EXPECT_EQ(admission.usage().pending_steps, 0u);
    EXPECT_EQ(admission.usage().pending_bytes, 0u);
    EXPECT_EQ(admission.usage().memory_bytes, 800u);  // both buffers kept for the next step
    // A corrupt block's buffer comes back through GiveBack and is reused.
    std::vector<float> again = *acc->TakeBuffer();
    acc->GiveBack(std::move(again));
    EXPECT_EQ(admission.usage().memory_bytes, 800u);
  }
  EXPECT_EQ(admission.usage().memory_bytes, 0u);  // released with the accumulator
}

TEST(StepAccumulator, BufferOverTheBudgetIsRefused) {
  Admission admission({.memory_budget_bytes = 1 << 20});
  ASSERT_TRUE(admission.ReserveMemory((1 << 20) - 100, "others").ok());
  auto acc = MakeAdmitted(&admission, 1, 100);
  absl::StatusOr<std::vector<float>> b = acc->TakeBuffer();
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("step buffer for key 'w' chunk 0"));
}

TEST(StepAccumulator, PushRefusedByPendingLimitLeavesNoTrace) {
  Admission admission({.memory_budget_bytes = 1 << 20, .max_pending_steps = 1});
  ASSERT_TRUE(admission.AddPending(true, 0, "another chunk").ok());  // the one allowed
  auto acc = MakeAdmitted(&admission, 2, 10);
  absl::StatusOr<StepAccumulator::Outcome> r =
      acc->Push(0, 7, *acc->TakeBuffer(), absl::Now() + absl::Seconds(1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("limits.max_pending_steps"));
  admission.RemovePending(true, 0);
  // Step 7 was not started by the refused push: the chunk still accepts any first step.
  EXPECT_FALSE(*acc->Admit(0, 3));
  std::thread other([&] {
    EXPECT_TRUE(acc->Push(1, 3, *acc->TakeBuffer(), absl::Now() + absl::Seconds(10)).ok());
  });
  EXPECT_TRUE(acc->Push(0, 3, *acc->TakeBuffer(), absl::Now() + absl::Seconds(10)).ok());
  other.join();
  EXPECT_EQ(admission.usage().pending_steps, 0u);
}

TEST(StepAccumulator, NoAnswerBeforeTheBackupsHaveTheState) {
  StepAccumulatorOptions o;
  o.workers = 2;
  o.label = "key 'w' chunk 0";
  absl::Mutex mu;
  std::vector<int64_t> replicated;  // completed steps the backups got
  absl::Status next_reply = absl::UnavailableError("backup shard 1 unreachable");
  o.replicate = [&](const ChunkSnapshot& snap) {
    absl::MutexLock lock(&mu);
    if (!next_reply.ok()) {
      absl::Status s = next_reply;
      next_reply = absl::OkStatus();  // the next try succeeds
      return s;
    }
    replicated.push_back(snap.completed_step);
    return absl::OkStatus();
  };
  StepAccumulator acc(o, cluster::Optimizer({}, 1), RawFinalizer(),
                      [](uint32_t w) { return absl::StrCat("worker-", w); });
  // Step 0: the replication fails, so both pushers get its error and no result.
  std::vector<absl::Status> first(2);
  std::vector<std::thread> threads;
  for (uint32_t w = 0; w < 2; ++w) {
    threads.emplace_back([&, w] {
      first[w] = acc.Push(w, 0, {float(w)}, absl::Now() + absl::Seconds(10)).status();
    });
  }
  for (auto& t : threads) t.join();
  int unavailable = 0;
  for (const absl::Status& s : first) unavailable += absl::IsUnavailable(s);
  EXPECT_GE(unavailable, 1);  // the replicating pusher; the other may have retried and won
  // Resent pushes are duplicates of the completed step: they replicate, then answer.
  for (uint32_t w = 0; w < 2; ++w) {
    auto r = acc.Push(w, 0, {}, absl::Now() + absl::Seconds(10));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->duplicate);
    EXPECT_EQ(Values(*r->reply), (std::vector<float>{0.5f}));
  }
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(replicated, (std::vector<int64_t>{0}));  // once, not per answer
  }
  // Restored state (a promoted backup) is replicated before its first answer too.
  StepAccumulator promoted(o, cluster::Optimizer({}, 1), RawFinalizer(),
                           [](uint32_t w) { return absl::StrCat("worker-", w); });
  ASSERT_TRUE(promoted.Restore(acc.Snapshot()).ok());
  auto r = promoted.Push(1, 0, {}, absl::Now() + absl::Seconds(10));
  ASSERT_TRUE(r.ok()) << r.status();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(replicated, (std::vector<int64_t>{0, 0}));
}

// The pool that runs PushAsync decodes every push: a replication (a call to the backups,
// which a dead one holds for its deadline) must not take its threads. It runs on
// `blocking`, once per chunk however many pushes of the step come meanwhile, and those
// pushes wait for it without a thread.
TEST(StepAccumulator, PushAsyncReplicatesOnItsBlockingRunnerOncePerChunk) {
  StepAccumulatorOptions o;
  o.workers = 2;
  o.label = "key 'w' chunk 0";
  absl::Notification release;
  std::atomic<int> replications{0};
  std::atomic<bool> on_caller{false};
  const std::thread::id caller = std::this_thread::get_id();
  o.replicate = [&](const ChunkSnapshot&) {
    ++replications;
    if (std::this_thread::get_id() == caller) on_caller = true;
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
    return absl::OkStatus();
  };
  StepAccumulator acc(o, cluster::Optimizer({}, 1), RawFinalizer(),
                      [](uint32_t w) { return absl::StrCat("worker-", w); });
  std::atomic<int> scheduled{0};
  std::vector<std::thread> runners;
  auto blocking = [&]() -> StepAccumulator::Blocking {
    return [&](StepAccumulator::Work work) {
      ++scheduled;
      runners.emplace_back([work = std::move(work)]() mutable { std::move(work)(); });
    };
  };
  absl::Mutex mu;
  std::vector<absl::StatusOr<StepAccumulator::Outcome>> answers;
  auto done = [&]() -> StepAccumulator::Done {
    return [&](absl::StatusOr<StepAccumulator::Outcome> r) {
      absl::MutexLock lock(&mu);
      answers.push_back(std::move(r));
    };
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  acc.PushAsync(0, 0, {1.0f}, deadline, nullptr, done(), blocking());
  // Completes the step: returns at once, the replication on a runner.
  acc.PushAsync(1, 0, {3.0f}, deadline, nullptr, done(), blocking());
  // A resend of the completed step while it replicates: no second runner.
  acc.PushAsync(0, 0, {}, deadline, nullptr, done(), blocking());
  EXPECT_EQ(scheduled.load(), 1);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(answers.empty()) << "answered before the backups have the state";
  }
  release.Notify();
  for (std::thread& t : runners) t.join();
  absl::MutexLock lock(&mu);
  ASSERT_EQ(answers.size(), 3u);
  for (const auto& r : answers) {
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(Values(*r->reply), (std::vector<float>{2.0f}));
  }
  EXPECT_EQ(replications.load(), 1);
  EXPECT_FALSE(on_caller.load());
}

}  // namespace
}  // namespace gcomp::server
