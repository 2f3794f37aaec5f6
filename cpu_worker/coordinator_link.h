// The worker's control-plane connection to its coordinator (DESIGN.md §7): Register once it can
// serve, then a Heartbeat every interval from a thread of its own. The coordinator answers a
// heartbeat with "exit" when it no longer wants this worker (replaced after a restart, shutting
// down), and a coordinator that stops answering for long is treated as gone; either way
// should_exit() turns true and the serve loop ends.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace moe::worker {

struct WorkerIdentity {
  std::string worker_id;
  int numa_node = -1;
  std::vector<int> cpus;
  int threads = 0;
  std::string segment;
  std::string isa;
};

struct WorkStats {
  uint64_t requests_served = 0;
  double busy_ms = 0;
};

class CoordinatorLink {
 public:
  // Registers with the coordinator at `addr`, retrying until `timeout` passes; throws moe::Error
  // with the coordinator's reason when it refuses, or when it cannot be reached in time.
  CoordinatorLink(const std::string& addr, const WorkerIdentity& me,
                  std::chrono::milliseconds timeout);
  ~CoordinatorLink();
  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  // Starts the heartbeat thread; `stats` is called from it.
  void start_heartbeats(std::function<WorkStats()> stats);
  bool should_exit() const { return exit_.load(std::memory_order_relaxed); }
  // Why should_exit() turned true.
  std::string exit_reason() const;

 private:
  void heartbeat_loop(std::function<WorkStats()> stats);

  struct Stub;
  std::unique_ptr<Stub> stub_;
  WorkerIdentity me_;
  std::chrono::milliseconds interval_{500};
  std::atomic<bool> exit_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string reason_;
  std::string secret_;  // from kWorkerSecretEnv
  std::thread thread_;
};

}  // namespace moe::worker
