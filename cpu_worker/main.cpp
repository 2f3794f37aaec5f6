// moe-cpu-worker: computes routed experts for a coordinator over shared memory (DESIGN.md §2).
// The coordinator creates the segment and starts us with everything on the command line; we bind
// memory to our NUMA node, load the model's expert tensors, attach, register over gRPC (with
// --coordinator), set worker_ready and serve until SHUTDOWN.
// Exit status: 0 after SHUTDOWN, 1 on an error (bad model or segment, registration refused), 2 on
// bad arguments, 3 when the coordinator died or told us to exit.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/gguf.h"
#include "common/placement/numa_binding.h"
#include "common/shm/shm_segment.h"
#include "cpu_worker/coordinator_link.h"
#include "cpu_worker/expert_server.h"
#include "cpu_worker/process_watch.h"
#include "experts/cpu_expert_executor.h"
#include "experts/expert_protocol.h"
#include "experts/model_config.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/thread_pool.h"

namespace {

using namespace moe;

struct Args {
  std::string model, segment;
  int coordinator_pid = 0;  // 0: our parent
  int threads = 0;          // 0: one per --cpus entry, else every hardware thread
  std::vector<int> cpus;
  uint32_t spin = shm::kDefaultSpin;
  int pool_spin = cpu::ThreadPool::kDefaultSpin;
  std::string coordinator_addr, worker_id = "cpu-0";
  int numa_node = -1;
  int register_timeout_ms = 30000;
};

int run(const Args& a) {
  const worker::ProcessWatch coordinator(a.coordinator_pid > 0 ? a.coordinator_pid : ::getppid());
  // Before anything is allocated, so buffers and thread stacks land on our node.
  const std::string numa = placement::bind_memory_to_node(a.numa_node);
  const auto file = gguf::GgufFile::open(a.model);
  const model::ModelConfig cfg = model::ModelConfig::from_gguf(file);
  const int threads = a.threads > 0 ? a.threads
                      : !a.cpus.empty()
                          ? static_cast<int>(a.cpus.size())
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::ThreadPool pool(threads, a.cpus, a.pool_spin);
  // The same kernels as the in-process executor, so results are bitwise equal.
  const auto experts = model::cpu_experts_for(file, pool);

  const shm::ShmSegment seg = shm::ShmSegment::open(a.segment);
  std::unique_ptr<worker::CoordinatorLink> link;
  worker::ExpertServer server(
      *experts, {cfg.n_layer, cfg.n_embd, cfg.n_expert},
      shm::attach_expert_segment(seg.data(), seg.size()),
      [&] { return coordinator.alive() && !(link && link->should_exit()); }, a.spin);
  if (!a.coordinator_addr.empty()) {
    worker::WorkerIdentity me{a.worker_id, a.numa_node,
                              a.cpus,      threads,
                              a.segment,   std::string(cpu::isa_name(cpu::best_isa()))};
    link = std::make_unique<worker::CoordinatorLink>(
        a.coordinator_addr, me, std::chrono::milliseconds(a.register_timeout_ms));
    link->start_heartbeats([&] {
      return worker::WorkStats{server.requests_served(), server.busy_ms()};
    });
  }
  std::fprintf(stderr, "moe-cpu-worker %s (pid %d): %d threads, %s; serving %s\n",
               a.worker_id.c_str(), static_cast<int>(::getpid()), threads, numa.c_str(),
               a.segment.c_str());
  if (server.serve() == worker::ServeEnd::CoordinatorGone) {
    const std::string why =
        !coordinator.alive() ? "coordinator (pid " + std::to_string(coordinator.pid()) + ") is gone"
        : link               ? link->exit_reason()
                             : "the coordinator is gone";
    std::fprintf(stderr, "moe-cpu-worker %s: %s; exiting\n", a.worker_id.c_str(), why.c_str());
    // A coordinator killed outright cannot remove the segment it made; we are its last user.
    if (!coordinator.alive()) shm::remove_segment(a.segment);
    return 3;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Computes MoE experts for a moe-runtime coordinator over shared memory"};
  Args a;
  app.add_option("--model", a.model, "GGUF model file (the coordinator's)")->required();
  app.add_option("--segment", a.segment, "shared-memory segment created by the coordinator")
      ->required();
  app.add_option("--coordinator-pid", a.coordinator_pid,
                 "exit when this process dies (default: the parent)")
      ->check(CLI::PositiveNumber);
  app.add_option("--threads", a.threads, "threads (default: one per --cpus entry, else all)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--cpus", a.cpus, "pin thread i to the i-th core of this list, e.g. 0,1")
      ->delimiter(',')
      ->check(CLI::Range(0, 65535));
  app.add_option("--spin", a.spin, "pause iterations before sleeping while waiting for work");
  app.add_option("--pool-spin", a.pool_spin, "pause iterations an idle pool thread spins")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--coordinator", a.coordinator_addr,
                 "register with the coordinator's gRPC Control service at HOST:PORT and send it "
                 "heartbeats (default: none)");
  app.add_option("--worker-id", a.worker_id, "our name in the coordinator's placement");
  app.add_option("--numa-node", a.numa_node, "prefer this NUMA node's memory (-1: no binding)")
      ->check(CLI::Range(-1, 4095));
  app.add_option("--register-timeout-ms", a.register_timeout_ms,
                 "give up when the coordinator has not accepted the registration by then")
      ->check(CLI::Range(1, 3600000));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-cpu-worker: error: %s\n", e.what());
    return 1;
  }
}
