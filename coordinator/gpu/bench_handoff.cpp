// moe-bench-handoff: what one CPU -> GPU hand-off per MoE layer costs, medians of many rounds:
//   - the latency from the host's release of a waiting stream to the stream's report back (a
//     stream memory write the host spins on), for both StreamFlag waiters, after the stream has
//     waited 0 to 1000 us (a layer's CPU share takes ~100-200 us; a waiter that polls more
//     slowly the longer it waits shows here);
//   - a CpuShareRunner round trip with an empty job (wake the runner thread, which releases the
//     stream), per waiter;
//   - the pre-hand-off way: a 4-byte copy and cudaStreamSynchronize.
// Run on the GPU machine; the numbers are in docs/performance-log.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <span>
#include <utility>
#include <vector>

#include "common/error.h"
#include "coordinator/gpu/cpu_share_runner.h"
#include "coordinator/gpu/cuda_handles.h"
#include "coordinator/gpu/gpu_options.h"
#include "coordinator/gpu/pinned_buffer.h"
#include "coordinator/gpu/stream_flag.h"
#include "kernels/cuda/cuda_check.h"

namespace {

using Clock = std::chrono::steady_clock;

class EmptyJob : public moe::model::ExpertExecutor {
 public:
  void run(int64_t, const float*, int64_t, std::span<const moe::model::ExpertItem>,
           float*) override {}
};

double median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

template <typename Round>
double median_us(int rounds, Round&& round) {
  std::vector<double> us;
  for (int i = 0; i < rounds; ++i) {
    const auto t0 = Clock::now();
    round(static_cast<uint32_t>(i + 1));
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return median(std::move(us));
}

void spin_until(const moe::gpu::StreamFlag& f, uint32_t v) {
  while (f.get() != v) __builtin_ia32_pause();
}

// Latency from the host's release to the stream's report, after the stream waited `delay_us`
// (a layer's CPU share takes ~100-200 us: a waiter may poll more slowly the longer it waits).
double release_latency_us(moe::gpu::StreamFlag& go, moe::gpu::StreamFlag& back, cudaStream_t s,
                          double delay_us, int rounds) {
  std::vector<double> us;
  for (int r = 0; r < rounds; ++r) {
    const auto i = static_cast<uint32_t>(r + 1) + go.get();
    go.wait(s, i);
    back.write(s, i);
    const auto t_enq = Clock::now();
    while (std::chrono::duration<double, std::micro>(Clock::now() - t_enq).count() < delay_us) {
      __builtin_ia32_pause();
    }
    const auto t0 = Clock::now();
    go.set(i);
    spin_until(back, i);
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return median(std::move(us));
}

int bench() {
  using namespace moe::gpu;
  constexpr int kRounds = 1000;
  CudaStream s;
  StreamFlag back(StreamFlag::Waiter::MemOp);
  if (!back.supported()) {
    std::printf("stream memory operations unavailable: %s\n", back.refusal().c_str());
    return 1;
  }
  for (const auto waiter : {StreamFlag::Waiter::MemOp, StreamFlag::Waiter::Kernel}) {
    const char* name = waiter == StreamFlag::Waiter::MemOp ? "memop " : "kernel";
    StreamFlag go(waiter);
    (void)release_latency_us(go, back, s.get(), 0, 100);  // warm-up
    for (const double delay : {0.0, 20.0, 100.0, 300.0, 1000.0}) {
      std::printf("%s wait, released after %6.0f us: stream reports back in %7.2f us (median)\n",
                  name, delay, release_latency_us(go, back, s.get(), delay, kRounds / 2));
    }
    EmptyJob job;
    CpuShareRunner runner(job, /*async=*/true, kGpuPoolSpin, waiter);
    for (int pass = 0; pass < 2; ++pass) {
      const double handoff = median_us(kRounds, [&](uint32_t) {
        runner.start(0, nullptr, 0, {}, nullptr);
        runner.enqueue_wait(s.get());
        const uint32_t v = back.get() + 1;
        back.write(s.get(), v);
        spin_until(back, v);
        runner.join();
      });
      if (pass == 1) {
        std::printf("%s CpuShareRunner round trip, empty job: %7.2f us (median)\n", name, handoff);
      }
    }
  }
  void* d = nullptr;
  MOE_CUDA_CHECK(cudaMalloc(&d, 4));
  PinnedBuffer h;
  h.reserve(4);
  double sync = 0;
  for (int pass = 0; pass < 2; ++pass) {
    sync = median_us(kRounds, [&](uint32_t) {
      MOE_CUDA_CHECK(cudaMemcpyAsync(h.get(), d, 4, cudaMemcpyDeviceToHost, s.get()));
      MOE_CUDA_CHECK(cudaStreamSynchronize(s.get()));
    });
  }
  MOE_CUDA_CHECK(cudaFree(d));
  std::printf("host sync round trip (4-byte copy + stream synchronize): %7.2f us (median)\n", sync);
  return 0;
}

}  // namespace

int main() {
  try {
    return bench();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-bench-handoff: %s\n", e.what());
    return 1;
  }
}
