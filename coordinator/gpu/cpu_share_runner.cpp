#include "coordinator/gpu/cpu_share_runner.h"

#include <chrono>
#include <string>
#include <utility>

#include "common/error.h"

namespace moe::gpu {

CpuShareRunner::CpuShareRunner(model::ExpertExecutor& executor, bool async, int spin,
                               StreamFlag::Waiter waiter)
    : executor_(executor),
      spin_(spin),
      host_only_(waiter == StreamFlag::Waiter::HostOnly),
      flag_(waiter) {
  // A host-only flag runs the thread too (no stream can wait, but the host side is the same).
  if (async && (flag_.supported() || waiter == StreamFlag::Waiter::HostOnly)) {
    thread_ = std::thread([this] { runner_main(); });
  }
}

CpuShareRunner::~CpuShareRunner() {
  if (!thread_.joinable()) return;
  try {
    join();
  } catch (...) {
    // The error belonged to a forward that was already abandoned.
  }
  stop_.store(true, std::memory_order_release);
  posted_.fetch_add(1, std::memory_order_acq_rel);
  posted_.notify_one();
  thread_.join();
}

void CpuShareRunner::start(int64_t layer, const float* x, int64_t n,
                           std::span<const model::ExpertItem> items, float* out) {
  join();
  ready_ = nullptr;
  prepare_ = nullptr;
  layer_ = layer;
  x_ = x;
  n_ = n;
  items_ = items;
  out_ = out;
  error_ = nullptr;
  pending_ = true;
  ++seq_;
  if (async()) {
    posted_.store(seq_, std::memory_order_release);
    posted_.notify_one();
  }
}

void CpuShareRunner::start_when(const uint32_t* ready, uint32_t value, cudaStream_t stream,
                                Prepare prepare, int64_t layer, const float* x, int64_t n,
                                float* out) {
  if (!async()) throw Error("CpuShareRunner: start_when needs the runner thread");
  join();
  ready_ = ready;
  ready_value_ = value;
  ready_stream_ = stream;
  prepare_ = std::move(prepare);
  cancel_.store(false, std::memory_order_relaxed);
  layer_ = layer;
  x_ = x;
  n_ = n;
  items_ = {};
  out_ = out;
  error_ = nullptr;
  pending_ = true;
  ++seq_;
  posted_.store(seq_, std::memory_order_release);
  posted_.notify_one();
}

void CpuShareRunner::abandon() noexcept {
  cancel_.store(true, std::memory_order_release);
  try {
    join();
  } catch (...) {
    // The forward is failing already; its first error is the one reported.
  }
}

void CpuShareRunner::wait_ready() {
  const auto t0 = std::chrono::steady_clock::now();
  const auto reached = [&] {
    const uint32_t v = __atomic_load_n(ready_, __ATOMIC_ACQUIRE);
    return static_cast<int32_t>(v - ready_value_) >= 0;
  };
  for (uint64_t i = 1; !reached(); ++i) {
    __builtin_ia32_pause();
    if (i % 4096 != 0) continue;
    if (cancel_.load(std::memory_order_acquire))
      throw Error("CPU share: the forward was abandoned");
    if (host_only_) continue;
    // Every ~4096 pauses (tens of µs): a failed stream never publishes.
    const cudaError_t st = cudaStreamQuery(ready_stream_);
    if (st != cudaSuccess && st != cudaErrorNotReady) {
      (void)cudaGetLastError();
      throw Error(std::string("CPU share: the GPU stream failed before routing: ") +
                  cudaGetErrorString(st));
    }
    if (st == cudaSuccess && !reached()) {
      throw Error("CPU share: the GPU stream finished without publishing the routing");
    }
  }
  routing_wait_us_ +=
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void CpuShareRunner::enqueue_wait(cudaStream_t stream) {
  if (!pending_) return;
  if (async()) {
    flag_.wait(stream, seq_);
    return;
  }
  // Synchronous: the GPU's own work is already enqueued, so computing here still overlaps it.
  execute();
  done_.store(seq_, std::memory_order_release);
}

void CpuShareRunner::join() {
  if (!pending_) return;
  if (async()) {
    // Short spin: the caller usually arrives after the job ended; otherwise sleep and leave the
    // core to the pool's threads.
    uint32_t now = done_.load(std::memory_order_acquire);
    for (int i = 0; i < 256 && now != seq_; ++i) {
      __builtin_ia32_pause();
      now = done_.load(std::memory_order_acquire);
    }
    while (now != seq_) {
      done_.wait(now, std::memory_order_acquire);
      now = done_.load(std::memory_order_acquire);
    }
  } else if (done_.load(std::memory_order_acquire) != seq_) {
    // Started but never waited on (an error between the two): nothing was computed.
    done_.store(seq_, std::memory_order_release);
  }
  pending_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CpuShareRunner::execute() noexcept {
  auto t0 = std::chrono::steady_clock::now();
  try {
    if (ready_) {
      wait_ready();
      items_ = prepare_();
      t0 = std::chrono::steady_clock::now();  // job_us_: the experts' time, not the wait
    }
    executor_.run(layer_, x_, n_, items_, out_);
  } catch (...) {
    error_ = std::current_exception();
  }
  job_us_ =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
}

void CpuShareRunner::runner_main() {
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = posted_.load(std::memory_order_acquire);
    for (int i = 0; i < spin_ && now == seen; ++i) {
      __builtin_ia32_pause();
      now = posted_.load(std::memory_order_acquire);
    }
    while (now == seen) {
      posted_.wait(seen, std::memory_order_acquire);
      now = posted_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    execute();
    // The flag releases the GPU stream; done_ the host. Both after the result is written, and
    // also when the job failed, so a stream waiting on it never hangs.
    flag_.set(now);
    done_.store(now, std::memory_order_release);
    done_.notify_one();
  }
}

}  // namespace moe::gpu
