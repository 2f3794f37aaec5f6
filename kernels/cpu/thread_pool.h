// A fixed set of worker threads, optionally pinned, that run one parallel loop at a time.
// Dispatch allocates nothing: the loop body is passed by reference and the caller participates.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <thread>
#include <type_traits>
#include <vector>

namespace moe::cpu {

class ThreadPool {
 public:
  // Spinning briefly (tens of microseconds) before sleeping keeps the per-layer dispatch cost low
  // while idle pools sleep in the kernel (futex via std::atomic::wait). Longer spins hurt badly
  // when the machine is oversubscribed (the spinner holds the core the awaited thread needs) and
  // help when a pool owns its cores but idles while another process works (expert workers).
  static constexpr int kDefaultSpin = 2000;

  // n_threads >= 1 (the calling thread counts as thread 0). When `cores` is non-empty, thread i
  // is pinned to cores[i % cores.size()] (the caller's thread too). `spin`: pause iterations a
  // waiting thread spends before it sleeps. Throws moe::Error on bad args.
  explicit ThreadPool(int n_threads, const std::vector<int>& cores = {}, int spin = kDefaultSpin);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(task, thread) for every task in [0, n_tasks), tasks handed out dynamically in
  // order; returns when all are done. Not reentrant. An exception thrown by fn is rethrown here
  // after every thread has stopped.
  template <typename Fn>
  void parallel_for(int64_t n_tasks, Fn&& fn) {
    run(n_tasks, &invoke<std::remove_reference_t<Fn>>, &fn);
  }

 private:
  using Trampoline = void (*)(void* ctx, int64_t task, int thread);
  template <typename Fn>
  static void invoke(void* ctx, int64_t task, int thread) {
    (*static_cast<Fn*>(ctx))(task, thread);
  }
  void run(int64_t n_tasks, Trampoline tramp, void* ctx);
  void worker_main(int index);
  void work(int thread);

  int n_threads_;
  int spin_;
  std::vector<std::thread> threads_;
  // Published per job; workers read them after observing a new generation.
  Trampoline tramp_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_tasks_ = 0;
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

}  // namespace moe::cpu
