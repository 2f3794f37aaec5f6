#include "kernels/cpu/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include "common/error.h"

namespace moe::cpu {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    // Spin 0 (sleep at once) and a long spin exercise both wake-up paths.
    const int spin = threads == 3 ? 0 : threads == 2 ? 100000 : ThreadPool::kDefaultSpin;
    ThreadPool pool(threads, {}, spin);
    for (int rep = 0; rep < 300; ++rep) {
      const int64_t n = 1 + rep % 97;
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_thread{0};
      pool.parallel_for(n, [&](int64_t task, int thread) {
        hits[static_cast<size_t>(task)].fetch_add(1);
        if (thread < 0 || thread >= threads) bad_thread.fetch_add(1);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1);
      ASSERT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPool, UsesMoreThanOneThreadForManyTasks) {
  ThreadPool pool(2);
  std::atomic<int> seen_other{0};
  for (int rep = 0; rep < 50 && seen_other.load() == 0; ++rep) {
    pool.parallel_for(64, [&](int64_t, int thread) {
      volatile double s = 0;
      for (int i = 0; i < 20000; ++i) s = s + i;
      if (thread == 1) seen_other.store(1);
    });
  }
  EXPECT_EQ(seen_other.load(), 1);
}

TEST(ThreadPool, PropagatesTheFirstExceptionAndStaysUsable) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100,
                                 [](int64_t task, int) {
                                   if (task == 17) throw std::runtime_error("task 17 failed");
                                 }),
               std::runtime_error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t task, int) { sum.fetch_add(task); });
  EXPECT_EQ(sum.load(), 45);
}

TEST(ThreadPool, ZeroTasksIsANoOp) {
  ThreadPool pool(2);
  int calls = 0;
  pool.parallel_for(0, [&](int64_t, int) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(ThreadPool, RejectsBadArguments) {
  EXPECT_THROW(ThreadPool(0), Error);
  EXPECT_THROW(ThreadPool(2, {-1}), Error);
  EXPECT_THROW(ThreadPool(2, {1 << 20}), Error);
  EXPECT_THROW(ThreadPool(2, {}, -1), Error);
}

TEST(ThreadPool, PinsEveryThreadToTheGivenCores) {
  // Runs in its own thread because the pool pins its caller too.
  std::atomic<int> pinned{0}, unpinned{0};
  std::thread t([&] {
    ThreadPool pool(2, {0});
    pool.parallel_for(64, [&](int64_t, int) {
      cpu_set_t set;
      CPU_ZERO(&set);
      pthread_getaffinity_np(pthread_self(), sizeof(set), &set);
      (CPU_COUNT(&set) == 1 && CPU_ISSET(0, &set) ? pinned : unpinned).fetch_add(1);
    });
  });
  t.join();
  EXPECT_EQ(pinned.load(), 64);
  EXPECT_EQ(unpinned.load(), 0);
}

}  // namespace
}  // namespace moe::cpu
