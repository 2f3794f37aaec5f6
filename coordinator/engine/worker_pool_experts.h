// The routed experts of the model computed by the CPU worker processes of a placement: one
// RemoteExpertExecutor per worker, each expert owned by one worker (expert e by worker e mod n),
// all workers computing a layer's batch at once. It also supervises them: a worker that died is
// reported as WorkerUnavailable for the request that saw it and started again, under the same id,
// by the next ensure_ready() (at the start of the next request or health check).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/placement/placement.h"
#include "coordinator/engine/worker_registry.h"
#include "experts/expert_executor.h"
#include "experts/remote_expert_executor.h"

namespace moe::engine {

// A worker died or cannot be started: the request fails with UNAVAILABLE.
class WorkerUnavailable : public moe::Error {
 public:
  using moe::Error::Error;
};

struct WorkerPoolOptions {
  // worker_bin, model_path, n_embd, spin, pool_spin, start_timeout; role, cpus and threads are
  // set per worker from `workers`.
  model::RemoteExpertOptions base;
  std::vector<placement::CpuWorkerSpec> workers;
  std::string coordinator_addr;  // where the workers register (gRPC Control)
  std::chrono::milliseconds register_timeout{10000};
  // A registered worker silent (no heartbeat) this long while a request waits on it is killed as
  // hung; the request fails UNAVAILABLE and the next one starts it again. 0: never.
  std::chrono::milliseconds silence_limit{10000};
};

class WorkerPoolExperts final : public model::ExpertExecutor {
 public:
  // Starts every worker and waits until each is ready and registered; throws moe::Error (no
  // process or segment left behind) when one cannot be.
  WorkerPoolExperts(WorkerPoolOptions opt, WorkerRegistry& registry);
  ~WorkerPoolExperts() override;

  // With one worker, bitwise the in-process result; with several, each token's sum is added up
  // per worker first (equal up to rounding). Throws WorkerUnavailable when a worker died.
  void run(int64_t layer, const float* x, int64_t n_tokens,
           std::span<const model::ExpertItem> items, float* out) override;

  // Starts again every worker that has died; throws WorkerUnavailable when one cannot be.
  void ensure_ready();

  size_t size() const { return workers_.size(); }
  // Each worker's pid (0 for one not running), in placement order.
  std::vector<pid_t> worker_pids() const;

 private:
  std::unique_ptr<model::RemoteExpertExecutor> start(size_t i);
  [[noreturn]] void fail(size_t i, const std::exception& e);

  WorkerPoolOptions opt_;
  WorkerRegistry& registry_;
  std::vector<std::unique_ptr<model::RemoteExpertExecutor>> workers_;
  // Per-worker scratch of the split path.
  std::vector<std::vector<model::ExpertItem>> items_;
  std::vector<std::vector<float>> out_;
};

}  // namespace moe::engine
