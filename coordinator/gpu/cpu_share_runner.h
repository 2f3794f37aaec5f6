// Runs the CPU's share of a MoE layer (the routed experts without a VRAM copy) on a thread of its
// own, which becomes the thread pool's caller. Meanwhile the host thread that drives the GPU
// enqueues the layer's GPU experts and the next layer's attention, and the GPU stream waits for
// the CPU's result through a StreamFlag instead of a host synchronisation (design: issue 6 §1).
// Without stream memory operations, or with `async` off, the share is computed on the calling
// thread at enqueue_wait() instead, after the GPU work was enqueued.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <span>
#include <string>
#include <thread>

#include "coordinator/gpu/stream_flag.h"
#include "experts/expert_executor.h"

namespace moe::gpu {

class CpuShareRunner {
 public:
  // `spin`: pause iterations the runner spends waiting for the next job before it sleeps.
  CpuShareRunner(model::ExpertExecutor& executor, bool async, int spin,
                 StreamFlag::Waiter waiter = StreamFlag::Waiter::Kernel);
  ~CpuShareRunner();
  CpuShareRunner(const CpuShareRunner&) = delete;
  CpuShareRunner& operator=(const CpuShareRunner&) = delete;

  bool async() const { return thread_.joinable(); }
  // The flag's value: the last job that ended (for tests).
  uint32_t flag_value() const { return flag_.get(); }
  // Why the share runs on the calling thread although asynchronous hand-off was asked for.
  const std::string& refusal() const { return flag_.refusal(); }

  // Begins executor.run(layer, x, n, items, out). x, items and out stay untouched by the caller
  // until join(). At most one job at a time: join() the previous one first.
  void start(int64_t layer, const float* x, int64_t n, std::span<const model::ExpertItem> items,
             float* out);
  // Like start(), for a layer routed on the device: the items are not known yet. The runner waits
  // until the GPU has stored `value` (or later) into *ready (page-locked host memory), then takes
  // the items from prepare() and computes them. While it waits it checks `stream` now and then,
  // so a failed stream ends the job with its error instead of a hang; abandon() ends it too.
  // Needs async().
  using Prepare = std::function<std::span<const model::ExpertItem>()>;
  void start_when(const uint32_t* ready, uint32_t value, cudaStream_t stream, Prepare prepare,
                  int64_t layer, const float* x, int64_t n, float* out);
  // Ends a start_when() job still waiting for its routing (an error path), then joins it
  // dropping its error.
  void abandon() noexcept;
  // Time the runner waited for device routing, in all (µs).
  double routing_wait_us() const { return routing_wait_us_; }

  // Enqueues on `stream`: continue once the started job's result is in `out` (a failed job also
  // releases the stream, so nothing hangs; its error surfaces at join()).
  void enqueue_wait(cudaStream_t stream);
  // Waits for the started job, if any, and rethrows its error.
  void join();
  // A job was started and not joined yet.
  bool pending() const { return pending_; }
  // The last job that ended: its token and item counts and how long the executor took (µs).
  int64_t last_tokens() const { return n_; }
  int64_t last_items() const { return static_cast<int64_t>(items_.size()); }
  double last_us() const { return job_us_; }

 private:
  void runner_main();
  void execute() noexcept;
  // A start_when() job: waits on the runner thread until the routing is published (throws on a
  // failed stream or abandon()).
  void wait_ready();

  model::ExpertExecutor& executor_;
  int spin_;
  bool host_only_;  // no GPU: start_when() jobs poll their word only (tests)
  StreamFlag flag_;
  // The job, published by posted_ and read by the runner after it observes the new value.
  int64_t layer_ = 0, n_ = 0;
  const float* x_ = nullptr;
  std::span<const model::ExpertItem> items_;
  float* out_ = nullptr;
  double job_us_ = 0;
  // A start_when() job: the word and value it waits for, the stream it checks, its items.
  const uint32_t* ready_ = nullptr;
  uint32_t ready_value_ = 0;
  cudaStream_t ready_stream_ = nullptr;
  Prepare prepare_;
  double routing_wait_us_ = 0;
  std::atomic<bool> cancel_{false};
  std::exception_ptr error_;
  bool pending_ = false;  // a job was started and not joined
  uint32_t seq_ = 0;      // jobs started
  alignas(64) std::atomic<uint32_t> posted_{0};
  alignas(64) std::atomic<uint32_t> done_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace moe::gpu
