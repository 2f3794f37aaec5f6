// What the coordinator knows about its worker processes: the ones it started (STARTING), which of
// them registered over gRPC (READY), their heartbeats, and which died (DEAD, until a restart).
// Shared by the Control service (Register, Heartbeat, GetStats, GetPlacement) and the expert pool
// that starts and restarts the workers; every method is thread-safe.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace moe::engine {

enum class WorkerState { Starting, Ready, Dead };

struct WorkerRecord {
  std::string id;
  int numa_node = -1;
  std::vector<int> cpus;
  int threads = 0;
  pid_t pid = 0;
  std::string segment;
  std::string isa;
  WorkerState state = WorkerState::Starting;
  uint32_t restarts = 0;
  bool heartbeat_seen = false;
  std::chrono::steady_clock::time_point last_heartbeat;
  uint64_t requests_served = 0;
  double busy_ms = 0;  // of the current process, as its last heartbeat said
  // What the earlier processes under this id were busy for, as their last heartbeats said:
  // busy_ms_before + busy_ms is a total that does not go back when the worker is restarted.
  double busy_ms_before = 0;
};

struct Registration {
  std::string worker_id;
  pid_t pid = 0;
  int numa_node = -1;
  std::vector<int> cpus;
  int threads = 0;
  std::string segment;
  std::string isa;
};

class WorkerRegistry {
 public:
  // A worker process is about to be started (or restarted) under `id` and given `segment`; its pid
  // is not known yet, so the first process that registers with this id and segment is it.
  void expect(const std::string& id, const std::string& segment);
  // Register RPC. "" when accepted; otherwise why not (unknown id, another pid, another segment).
  std::string register_worker(const Registration& r);
  // Heartbeat RPC: false tells the worker to exit (not ours, replaced, or shutting down).
  bool heartbeat(const std::string& id, pid_t pid, uint64_t requests_served, double busy_ms);
  // How long `id` has sent no heartbeat (counted from its registration until the first one);
  // zero while it is not registered (starting or dead), when nothing is expected of it.
  std::chrono::milliseconds silent_for(const std::string& id) const;
  // Waits until `id` registered with `pid`; false on timeout.
  bool wait_registered(const std::string& id, pid_t pid, std::chrono::milliseconds timeout);
  void mark_dead(const std::string& id);
  // From now on every heartbeat is answered "exit".
  void begin_shutdown();
  std::vector<WorkerRecord> snapshot() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, WorkerRecord> workers_;
  bool shutting_down_ = false;
};

}  // namespace moe::engine
