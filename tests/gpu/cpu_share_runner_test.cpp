// The hand-off between the CPU's expert share and the GPU stream: a stream waiting on a
// StreamFlag passes only once the host sets it; a stream waiting on a CpuShareRunner's job passes
// only after the job wrote its result; a failing job releases the stream and its error surfaces at
// join(); the synchronous mode computes at enqueue_wait(). Those skip, saying why, without a
// device. The runner's host side (its thread, job order, errors, shutdown) also runs with a
// host-only flag, without a device: those tests run everywhere, CI's sanitizer build included.
#include "coordinator/gpu/cpu_share_runner.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/error.h"
#include "coordinator/gpu/cuda_handles.h"
#include "coordinator/gpu/stream_flag.h"
#include "kernels/cuda/cuda_check.h"
#include "tests/gpu/gpu_golden_util.h"

namespace {

using moe::gpu::CpuShareRunner;
using moe::gpu::CudaStream;
using moe::gpu::StreamFlag;
using moe::model::ExpertItem;

// Sleeps, then writes out[i] = x[i] * (1 + layer) for the first item's token row; throws when
// asked to. `finished` is set after the result is written.
class SlowExecutor : public moe::model::ExpertExecutor {
 public:
  void run(int64_t layer, const float* x, int64_t n, std::span<const ExpertItem> items,
           float* out) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    if (fail) throw std::runtime_error("expert worker died");
    for (int64_t i = 0; i < n * kWidth; ++i) out[i] = x[i] * static_cast<float>(1 + layer);
    calls.fetch_add(1);
    last_items = items.size();
    finished.store(true, std::memory_order_release);
  }
  static constexpr int64_t kWidth = 4;
  int sleep_ms = 30;
  bool fail = false;
  size_t last_items = 0;
  std::atomic<int> calls{0};
  std::atomic<bool> finished{false};
};

StreamFlag& spin_until(StreamFlag& f, uint32_t v) {
  while (f.get() != v) std::this_thread::yield();
  return f;
}

class StreamFlagWaiter : public ::testing::TestWithParam<StreamFlag::Waiter> {};

TEST_P(StreamFlagWaiter, StreamWaitsForTheHost) {
  REQUIRE_GPU();
  StreamFlag go(GetParam()), seen(StreamFlag::Waiter::MemOp);
  ASSERT_TRUE(go.supported()) << go.refusal();
  ASSERT_TRUE(seen.supported()) << seen.refusal();
  CudaStream s;
  go.wait(s.get(), 1);
  seen.write(s.get(), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(seen.get(), 0u) << "the stream passed a wait nobody released";
  go.set(1);
  spin_until(seen, 1);
  // Waits are cyclic comparisons: a later value releases an earlier wait at once.
  go.wait(s.get(), 1);
  seen.write(s.get(), 2);
  MOE_CUDA_CHECK(cudaStreamSynchronize(s.get()));
  EXPECT_EQ(seen.get(), 2u);
}

INSTANTIATE_TEST_SUITE_P(BothWaiters, StreamFlagWaiter,
                         ::testing::Values(StreamFlag::Waiter::MemOp, StreamFlag::Waiter::Kernel),
                         [](const auto& info) {
                           return info.param == StreamFlag::Waiter::MemOp ? "MemOp" : "Kernel";
                         });

TEST(CpuShareRunner, StreamPassesOnlyAfterTheJobWroteItsResult) {
  REQUIRE_GPU();
  SlowExecutor ex;
  CpuShareRunner runner(ex, /*async=*/true, 1000);
  ASSERT_TRUE(runner.async()) << runner.refusal();
  CudaStream s;
  StreamFlag seen(StreamFlag::Waiter::MemOp);
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8}, out(8, 0.f);
  const std::vector<ExpertItem> items = {{0, 3, 0.5f}, {1, 4, 0.5f}};
  for (uint32_t step = 1; step <= 3; ++step) {
    ex.finished.store(false);
    runner.start(static_cast<int64_t>(step), x.data(), 2, items, out.data());
    runner.enqueue_wait(s.get());
    seen.write(s.get(), step);
    spin_until(seen, step);
    EXPECT_TRUE(ex.finished.load(std::memory_order_acquire)) << "step " << step;
    runner.join();
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(out[i], x[i] * static_cast<float>(1 + step));
  }
  EXPECT_EQ(ex.calls.load(), 3);
  EXPECT_EQ(ex.last_items, items.size());
}

TEST(CpuShareRunner, FailedJobReleasesTheStreamAndRethrowsAtJoin) {
  REQUIRE_GPU();
  SlowExecutor ex;
  ex.fail = true;
  CpuShareRunner runner(ex, /*async=*/true, 1000);
  ASSERT_TRUE(runner.async()) << runner.refusal();
  CudaStream s;
  std::vector<float> x(4, 1.f), out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}};
  runner.start(0, x.data(), 1, items, out.data());
  runner.enqueue_wait(s.get());
  MOE_CUDA_CHECK(cudaStreamSynchronize(s.get()));  // would hang if the failure kept the flag
  EXPECT_THROW(
      {
        try {
          runner.join();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "expert worker died");
          throw;
        }
      },
      std::runtime_error);
  runner.join();  // reported once
  // The runner keeps working after a failure.
  ex.fail = false;
  runner.start(1, x.data(), 1, items, out.data());
  runner.enqueue_wait(s.get());
  runner.join();
  EXPECT_EQ(out[0], 2.f);
}

TEST(CpuShareRunner, SynchronousModeComputesAtEnqueueWait) {
  REQUIRE_GPU();
  SlowExecutor ex;
  ex.sleep_ms = 0;
  CpuShareRunner runner(ex, /*async=*/false, 0);
  EXPECT_FALSE(runner.async());
  CudaStream s;
  std::vector<float> x(4, 3.f), out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}};
  runner.start(2, x.data(), 1, items, out.data());
  EXPECT_EQ(ex.calls.load(), 0);
  runner.enqueue_wait(s.get());
  EXPECT_EQ(ex.calls.load(), 1);
  runner.join();
  EXPECT_EQ(out[3], 9.f);
}

TEST(CpuShareRunner, DestroyedWithAJobInFlight) {
  REQUIRE_GPU();
  SlowExecutor ex;
  std::vector<float> x(4, 1.f), out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}};
  {
    CpuShareRunner runner(ex, /*async=*/true, 1000);
    runner.start(0, x.data(), 1, items, out.data());
  }  // joins the job, then stops the thread
  EXPECT_EQ(ex.calls.load(), 1);
}

constexpr auto kHostOnly = StreamFlag::Waiter::HostOnly;

TEST(CpuShareRunnerHost, JobsRunInOrderAndTheFlagFollows) {
  SlowExecutor ex;
  ex.sleep_ms = 0;
  CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
  ASSERT_TRUE(runner.async());
  std::vector<float> x = {1, 2, 3, 4}, out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}};
  for (uint32_t job = 1; job <= 2000; ++job) {
    runner.start(static_cast<int64_t>(job % 5), x.data(), 1, items, out.data());
    if (job % 3 != 0) runner.join();  // otherwise the next start() joins it
    if (job % 3 != 0) {
      EXPECT_EQ(runner.flag_value(), job);
      EXPECT_EQ(out[3], 4.f * static_cast<float>(1 + job % 5)) << job;
    }
  }
  runner.join();
  EXPECT_EQ(ex.calls.load(), 2000);
  EXPECT_EQ(runner.flag_value(), 2000u);
  EXPECT_EQ(runner.last_items(), 1);
  EXPECT_EQ(runner.last_tokens(), 1);
  EXPECT_GE(runner.last_us(), 0.0);
}

TEST(CpuShareRunnerHost, FailedJobRethrowsOnceAndTheRunnerGoesOn) {
  SlowExecutor ex;
  ex.sleep_ms = 1;
  ex.fail = true;
  CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
  std::vector<float> x(4, 1.f), out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}};
  runner.start(0, x.data(), 1, items, out.data());
  EXPECT_THROW(runner.join(), std::runtime_error);
  EXPECT_EQ(runner.flag_value(), 1u);  // released although the job failed
  EXPECT_NO_THROW(runner.join());
  // A failed job's error also surfaces from the next start(), which joins it first.
  runner.start(0, x.data(), 1, items, out.data());
  EXPECT_THROW(runner.start(0, x.data(), 1, items, out.data()), std::runtime_error);
  ex.fail = false;
  runner.join();  // start() threw before beginning a job: nothing to join
  runner.start(2, x.data(), 1, items, out.data());
  runner.join();
  EXPECT_EQ(out[0], 3.f);
}

TEST(CpuShareRunnerHost, HostOnlyFlagRefusesAStreamWait) {
  SlowExecutor ex;
  ex.sleep_ms = 0;
  CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
  std::vector<float> x(4, 1.f), out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}};
  runner.start(0, x.data(), 1, items, out.data());
  EXPECT_THROW(runner.enqueue_wait(nullptr), moe::Error);
  runner.join();
  EXPECT_EQ(ex.calls.load(), 1);
}

// start_when(): the job waits for the word (the GPU's published routing), then takes its items.
TEST(CpuShareRunnerHost, StartWhenWaitsForTheWordThenTakesItsItems) {
  SlowExecutor ex;
  ex.sleep_ms = 0;
  CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
  std::vector<float> x = {1, 2, 3, 4}, out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}, {0, 2, 0.5f}};
  // Just below the wrap-around, released by a value past it: the comparison is cyclic.
  alignas(64) uint32_t word = 0xfffffff0u;
  std::atomic<int> prepared{0};
  std::atomic<uint32_t> seen_word{0};
  runner.start_when(
      &word, 0xfffffff8u, nullptr,
      [&]() -> std::span<const ExpertItem> {
        seen_word.store(__atomic_load_n(&word, __ATOMIC_ACQUIRE));
        prepared.fetch_add(1);
        return items;
      },
      2, x.data(), 1, out.data());
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(prepared.load(), 0);
  EXPECT_EQ(ex.calls.load(), 0);
  __atomic_store_n(&word, 3u, __ATOMIC_RELEASE);
  runner.join();
  EXPECT_EQ(prepared.load(), 1);
  EXPECT_EQ(seen_word.load(), 3u);
  EXPECT_EQ(ex.calls.load(), 1);
  EXPECT_EQ(ex.last_items, items.size());
  EXPECT_EQ(out[3], 12.f);
  EXPECT_GE(runner.routing_wait_us(), 20000.0);
  // A plain start() afterwards does not wait for any word.
  runner.start(0, x.data(), 1, items, out.data());
  runner.join();
  EXPECT_EQ(ex.calls.load(), 2);
}

TEST(CpuShareRunnerHost, AbandonEndsAJobStillWaitingForItsRouting) {
  SlowExecutor ex;
  ex.sleep_ms = 0;
  CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
  std::vector<float> x(4, 1.f), out(4, 0.f);
  alignas(64) uint32_t word = 0;
  bool prepared = false;
  runner.start_when(
      &word, 1, nullptr,
      [&]() -> std::span<const ExpertItem> {
        prepared = true;
        return {};
      },
      0, x.data(), 1, out.data());
  runner.abandon();  // the word never comes: no hang, no items taken, no error thrown
  EXPECT_FALSE(prepared);
  EXPECT_EQ(ex.calls.load(), 0);
  EXPECT_EQ(runner.flag_value(), 1u);  // a stream waiting on the job is released all the same
  EXPECT_FALSE(runner.pending());
}

TEST(CpuShareRunnerHost, StartWhenPrepareErrorRethrowsAtJoin) {
  SlowExecutor ex;
  ex.sleep_ms = 0;
  CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
  std::vector<float> x(4, 1.f), out(4, 0.f);
  alignas(64) uint32_t word = 7;
  runner.start_when(
      &word, 7, nullptr, []() -> std::span<const ExpertItem> { throw moe::Error("bad routing"); },
      0, x.data(), 1, out.data());
  EXPECT_THROW(runner.join(), moe::Error);
  EXPECT_EQ(ex.calls.load(), 0);
  EXPECT_EQ(runner.flag_value(), 1u);
}

TEST(CpuShareRunnerHost, DestroyedWithAJobInFlight) {
  SlowExecutor ex;
  ex.sleep_ms = 20;
  std::vector<float> x(4, 1.f), out(4, 0.f);
  const std::vector<ExpertItem> items = {{0, 1, 1.f}};
  {
    CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
    runner.start(0, x.data(), 1, items, out.data());
  }  // joins the job, then stops the thread
  EXPECT_EQ(ex.calls.load(), 1);
  {
    ex.fail = true;
    CpuShareRunner runner(ex, /*async=*/true, 100, kHostOnly);
    runner.start(0, x.data(), 1, items, out.data());
  }  // a failed job in flight: its error dies with the runner, no crash
  EXPECT_EQ(ex.calls.load(), 1);
}

}  // namespace
