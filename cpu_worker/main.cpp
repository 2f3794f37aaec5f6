// moe-cpu-worker: computes routed experts for a coordinator over shared memory (DESIGN.md §2).
// The coordinator creates the segment and starts us with everything on the command line; we load
// the model's expert tensors, attach, set worker_ready and serve until SHUTDOWN.
// Exit status: 0 after SHUTDOWN, 1 on an error (bad model or segment), 2 on bad arguments, 3 when
// the coordinator died.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "common/gguf.h"
#include "common/shm/expert_protocol.h"
#include "common/shm/shm_segment.h"
#include "coordinator/model/cpu_expert_executor.h"
#include "coordinator/model/model_config.h"
#include "cpu_worker/expert_server.h"
#include "cpu_worker/process_watch.h"
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
};

int run(const Args& a) {
  const worker::ProcessWatch coordinator(a.coordinator_pid > 0 ? a.coordinator_pid : ::getppid());
  const auto file = gguf::GgufFile::open(a.model);
  const model::ModelConfig cfg = model::ModelConfig::from_gguf(file);
  std::vector<model::ExpertLayerTensors> layers;
  for (int64_t l = 0; l < cfg.n_layer; ++l) {
    layers.push_back(
        model::require_expert_tensors(file, l, cfg.n_embd, cfg.n_ff_exp, cfg.n_expert));
  }
  const int threads = a.threads > 0 ? a.threads
                      : !a.cpus.empty()
                          ? static_cast<int>(a.cpus.size())
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  cpu::ThreadPool pool(threads, a.cpus, a.pool_spin);
  // The same kernels as the in-process executor, so results are bitwise equal.
  model::CpuExpertExecutor experts(std::move(layers), cfg.n_embd, cfg.n_ff_exp, cfg.n_expert, pool,
                                   cpu::best_isa());

  const shm::ShmSegment seg = shm::ShmSegment::open(a.segment);
  worker::ExpertServer server(
      experts, {cfg.n_layer, cfg.n_embd, cfg.n_expert},
      shm::attach_expert_segment(seg.data(), seg.size()), [&] { return coordinator.alive(); },
      a.spin);
  if (server.serve() == worker::ServeEnd::CoordinatorGone) {
    std::fprintf(stderr, "moe-cpu-worker: coordinator (pid %d) is gone; exiting\n",
                 static_cast<int>(coordinator.pid()));
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
