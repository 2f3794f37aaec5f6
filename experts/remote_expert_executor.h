// ExpertExecutor in a separate moe-cpu-worker process (DESIGN.md §2-§3): the coordinator copies a
// layer's activations and (token, expert, weight) items into a shared-memory segment, rings the
// worker, and copies the worker's per-token sums back. The worker is started (posix_spawn) by the
// constructor and told everything on its command line; a later step adds gRPC registration.
//
// Lifetime: construct it before anything heavy in the process, in particular before CUDA is
// initialized (DESIGN.md §2). Every exit path -- destructor, constructor failure, worker crash --
// ends the worker (SHUTDOWN, then SIGKILL after 2 s), reaps it and unlinks the segment.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "common/shm/shm_segment.h"
#include "common/shm/spsc_ring.h"
#include "experts/expert_executor.h"
#include "experts/expert_protocol.h"

namespace moe::model {

struct RemoteExpertOptions {
  std::string worker_bin;  // path of moe-cpu-worker
  std::string model_path;  // the GGUF the worker computes from: the coordinator's model
  int64_t n_embd = 0;      // of that model
  int threads = 1;         // worker threads
  std::vector<int> cpus;   // cores to pin the worker's threads to; empty: not pinned
  // Per-request capacity of the segment; larger batches are split into several requests.
  int64_t max_tokens = 512;
  int64_t max_items = 512 * 8;
  // Pause iterations either side spins before sleeping on the futex while it waits for the
  // other. Spinning saves the wake-up (tens of µs) when both sides have cores of their own; when
  // they share cores it steals them from the side that works, so use 0 there.
  uint32_t spin = shm::kDefaultSpin;
  int pool_spin = 2000;  // the worker's ThreadPool spin (see ThreadPool::kDefaultSpin)
  std::chrono::milliseconds start_timeout{60000};  // worker start until it is ready
  std::string role = "experts-0";                  // segment name: run_segment_name(role)
  std::vector<std::string> extra_args;             // appended to the worker's command line
  // Asked while a request waits for the worker: a non-empty answer says why the worker is taken
  // as hung (a stopped process answers nothing, and waiting on it would stall every request). It
  // is then killed, and the request fails as if it had died. Empty function: never hung.
  std::function<std::string()> hung;
};

class RemoteExpertExecutor final : public ExpertExecutor {
 public:
  // Removes stale segments of dead runs, creates the segment, starts the worker and waits until
  // it is ready. Throws moe::Error (leaving no process or segment behind) when the worker cannot
  // be started, exits or is not ready within start_timeout.
  explicit RemoteExpertExecutor(const RemoteExpertOptions& opt);
  ~RemoteExpertExecutor() override;

  // As ExpertExecutor::run. A batch within max_tokens/max_items goes as one request and gives
  // bitwise the result of an in-process CpuExpertExecutor::run (same kernels, same batch). A larger
  // one is split into requests of whole tokens (a token's items stay together and in order unless
  // they alone exceed max_items); it matches up to rounding only, because the kernels' summation
  // order depends on how many rows share an expert in one call. Throws moe::Error with the
  // worker's message for a rejected request, or "CPU worker (pid N) died ..." once it died; after
  // that every call throws.
  void run(int64_t layer, const float* x, int64_t n_tokens, std::span<const ExpertItem> items,
           float* out) override;

  // run() in two halves, so that several workers can compute at once: submit() copies the batch
  // in and rings the worker, collect() waits for its answer and copies the sums out. Only for a
  // batch that fits() one request; one submit() at a time, each followed by collect().
  bool fits(int64_t n_tokens, int64_t n_items) const {
    return n_tokens <= view_.dims.max_tokens && n_items <= view_.dims.max_items;
  }
  void submit(int64_t layer, const float* x, int64_t n_tokens, std::span<const ExpertItem> items);
  void collect(float* out);

  bool dead() const { return dead_; }
  // False once the worker has exited, noticed now rather than at the next request.
  bool alive() { return !dead_ && worker_.running(); }
  pid_t worker_pid() const { return worker_.pid(); }
  const std::string& segment_name() const { return seg_.name(); }

 private:
  void run_chunked(int64_t layer, const float* x, int64_t n_tokens,
                   std::span<const ExpertItem> items, float* out);
  // One request over the rings: n_tokens rows of x and n_items items are already in place.
  void send(int64_t layer, int64_t n_tokens, int64_t n_items) {
    push_request(layer, n_tokens, n_items);
    await_response();
  }
  void push_request(int64_t layer, int64_t n_tokens, int64_t n_items);
  void await_response();
  void check_layer(int64_t layer) const;
  [[noreturn]] void throw_dead();
  void wait_ready(const RemoteExpertOptions& opt);

  shm::ShmSegment seg_;  // declared first: unlinked last, after the worker is gone
  shm::ExpertSegment view_;
  shm::RingProducer requests_;
  shm::RingConsumer responses_;
  ChildProcess worker_;
  shm::WaitOptions wait_;  // liveness = the worker still runs and is not hung
  std::string hung_;       // why the worker was killed as hung; empty: it was not
  uint64_t seq_ = 0;
  bool dead_ = false;
  int64_t pending_tokens_ = -1;  // submit()ted rows awaiting collect(); -1: none
  // Grow-only buffers of the chunked path.
  std::vector<int32_t> offset_, cursor_, order_;
  std::vector<int64_t> chunk_tokens_;
};

}  // namespace moe::model
