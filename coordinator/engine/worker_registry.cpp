#include "coordinator/engine/worker_registry.h"

namespace moe::engine {

void WorkerRegistry::expect(const std::string& id, const std::string& segment) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = workers_.try_emplace(id);
  WorkerRecord& w = it->second;
  if (!fresh) ++w.restarts;
  const uint32_t restarts = w.restarts;
  const double busy_before = w.busy_ms_before + w.busy_ms;
  w = WorkerRecord{};
  w.id = id;
  w.segment = segment;
  w.restarts = restarts;
  w.busy_ms_before = busy_before;
}

std::string WorkerRegistry::register_worker(const Registration& r) {
  {
    std::lock_guard lock(mu_);
    auto it = workers_.find(r.worker_id);
    if (it == workers_.end()) return "no worker named '" + r.worker_id + "' was started here";
    WorkerRecord& w = it->second;
    if (w.pid != 0 && w.pid != r.pid) {
      return "worker '" + r.worker_id + "' is pid " + std::to_string(w.pid) + ", not " +
             std::to_string(r.pid);
    }
    if (w.segment != r.segment) {
      return "worker '" + r.worker_id + "' was given segment " + w.segment + ", not " + r.segment;
    }
    if (w.state == WorkerState::Dead) return "worker '" + r.worker_id + "' is marked dead";
    w.pid = r.pid;
    w.numa_node = r.numa_node;
    w.cpus = r.cpus;
    w.threads = r.threads;
    w.isa = r.isa;
    w.state = WorkerState::Ready;
    w.last_heartbeat = std::chrono::steady_clock::now();  // silence counts from here
  }
  cv_.notify_all();
  return "";
}

bool WorkerRegistry::heartbeat(const std::string& id, pid_t pid, uint64_t requests_served,
                               double busy_ms) {
  std::lock_guard lock(mu_);
  if (shutting_down_) return false;
  auto it = workers_.find(id);
  if (it == workers_.end() || it->second.pid != pid || it->second.state == WorkerState::Dead) {
    return false;
  }
  WorkerRecord& w = it->second;
  w.heartbeat_seen = true;
  w.last_heartbeat = std::chrono::steady_clock::now();
  w.requests_served = requests_served;
  w.busy_ms = busy_ms;
  return true;
}

std::chrono::milliseconds WorkerRegistry::silent_for(const std::string& id) const {
  std::lock_guard lock(mu_);
  const auto it = workers_.find(id);
  if (it == workers_.end() || it->second.state != WorkerState::Ready) {
    return std::chrono::milliseconds(0);
  }
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               it->second.last_heartbeat);
}

bool WorkerRegistry::wait_registered(const std::string& id, pid_t pid,
                                     std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  return cv_.wait_for(lock, timeout, [&] {
    auto it = workers_.find(id);
    return it != workers_.end() && it->second.pid == pid && it->second.state == WorkerState::Ready;
  });
}

void WorkerRegistry::mark_dead(const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = workers_.find(id);
  if (it != workers_.end()) it->second.state = WorkerState::Dead;
}

void WorkerRegistry::begin_shutdown() {
  std::lock_guard lock(mu_);
  shutting_down_ = true;
}

std::vector<WorkerRecord> WorkerRegistry::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<WorkerRecord> out;
  for (const auto& [id, w] : workers_) out.push_back(w);
  return out;
}

}  // namespace moe::engine
