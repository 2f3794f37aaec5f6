// The worker's loop (DESIGN.md §2-§3): requests from the coordinator's ring, experts computed from
// the segment's activations into its output area, answers on the response ring. Every request
// field comes from another process and is checked; a bad one gets an error answer, never a crash.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "experts/expert_executor.h"
#include "experts/expert_protocol.h"

namespace moe::worker {

// What the worker's model has: the bounds every request is checked against.
struct ExpertModelShape {
  int64_t n_layer = 0;
  int64_t n_embd = 0;
  int64_t n_expert = 0;
};

enum class ServeEnd { Shutdown, CoordinatorGone };

class ExpertServer {
 public:
  // Checks that the attached segment suits the model (n_embd) and has no worker yet; throws
  // moe::Error otherwise. `coordinator_alive` is polled while waiting for requests.
  // `spin`: pause iterations before sleeping while waiting for a request.
  ExpertServer(model::ExpertExecutor& experts, const ExpertModelShape& shape,
               const shm::ExpertSegment& segment, std::function<bool()> coordinator_alive,
               uint32_t spin = shm::kDefaultSpin);

  // Publishes our pid and worker_ready, then serves until SHUTDOWN or until the coordinator is
  // gone (noticed within one poll slice, ~10 ms, while idle).
  ServeEnd serve();

  // Work done so far, for heartbeats (read from another thread).
  uint64_t requests_served() const { return served_.load(std::memory_order_relaxed); }
  double busy_ms() const {
    return 1e-6 * static_cast<double>(busy_ns_.load(std::memory_order_relaxed));
  }

 private:
  shm::ExpertResponse handle(const shm::ExpertRequest& req);
  // "" when the request is valid; then items_ holds a private copy of its items.
  std::string validate(const shm::ExpertRequest& req);

  model::ExpertExecutor& experts_;
  ExpertModelShape shape_;
  shm::ExpertSegment seg_;
  shm::RingConsumer requests_;
  shm::RingProducer responses_;
  shm::WaitOptions wait_;
  std::vector<model::ExpertItem> items_;
  std::atomic<uint64_t> served_{0}, busy_ns_{0};
};

}  // namespace moe::worker
