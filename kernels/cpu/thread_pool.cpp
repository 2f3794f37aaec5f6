#include "kernels/cpu/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <cstring>
#include <string>

#include "common/error.h"

namespace moe::cpu {
namespace {

void pin_current_thread(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  const int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
  if (rc != 0) {
    throw Error("cannot pin thread to core " + std::to_string(core) + ": " + std::strerror(rc));
  }
}

}  // namespace

ThreadPool::ThreadPool(int n_threads, const std::vector<int>& cores, int spin)
    : n_threads_(n_threads), spin_(spin) {
  if (n_threads < 1)
    throw Error("thread count must be at least 1, got " + std::to_string(n_threads));
  if (spin < 0) throw Error("spin count must be >= 0, got " + std::to_string(spin));
  for (int core : cores) {
    if (core < 0 || core >= CPU_SETSIZE) throw Error("invalid core id " + std::to_string(core));
  }
  if (!cores.empty()) pin_current_thread(cores[0]);
  threads_.reserve(static_cast<size_t>(n_threads - 1));
  for (int i = 1; i < n_threads; ++i) {
    const int core = cores.empty() ? -1 : cores[static_cast<size_t>(i) % cores.size()];
    threads_.emplace_back([this, i, core] {
      if (core >= 0) {
        try {
          pin_current_thread(core);
        } catch (const Error&) {
          // Pinning the caller already succeeded for a valid core list; a failure here means
          // the core vanished (cpuset change). Running unpinned is better than dying.
        }
      }
      worker_main(i);
    });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::work(int thread) {
  for (;;) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) return;
    if (failed_.load(std::memory_order_relaxed)) continue;  // drain without running
    try {
      tramp_(ctx_, task, thread);
    } catch (...) {
      if (!failed_.exchange(true)) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_main(int index) {
  // Generation 0 is "no job yet": reading the counter here instead could miss a job published
  // before this thread started.
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = seen;
    for (int spin = 0; spin < spin_; ++spin) {
      now = generation_.load(std::memory_order_acquire);
      if (now != seen) break;
      __builtin_ia32_pause();
    }
    while (now == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    work(index);
    if (active_.fetch_sub(1, std::memory_order_acq_rel) == 1) active_.notify_one();
  }
}

void ThreadPool::run(int64_t n_tasks, Trampoline tramp, void* ctx) {
  if (n_tasks <= 0) return;
  if (n_tasks == 1 || n_threads_ == 1) {
    // Nothing to share: waking workers would only add latency.
    for (int64_t t = 0; t < n_tasks; ++t) tramp(ctx, t, 0);
    return;
  }
  tramp_ = tramp;
  ctx_ = ctx;
  n_tasks_ = n_tasks;
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  next_task_.store(0, std::memory_order_relaxed);
  active_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  work(0);
  for (int spin = 0; spin < spin_; ++spin) {
    if (active_.load(std::memory_order_acquire) == 0) break;
    __builtin_ia32_pause();
  }
  for (int left = active_.load(std::memory_order_acquire); left != 0;
       left = active_.load(std::memory_order_acquire)) {
    active_.wait(left, std::memory_order_acquire);
  }
  if (error_) std::rethrow_exception(error_);
}

}  // namespace moe::cpu
