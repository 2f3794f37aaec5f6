#include "coordinator/engine/worker_pool_experts.h"

#include "common/shm/shm_segment.h"

namespace moe::engine {

WorkerPoolExperts::WorkerPoolExperts(WorkerPoolOptions opt, WorkerRegistry& registry)
    : opt_(std::move(opt)), registry_(registry) {
  if (opt_.workers.empty()) throw Error("worker pool: the placement has no CPU workers");
  for (size_t i = 0; i < opt_.workers.size(); ++i) workers_.push_back(start(i));
  items_.resize(workers_.size());
  out_.resize(workers_.size());
}

WorkerPoolExperts::~WorkerPoolExperts() = default;

std::unique_ptr<model::RemoteExpertExecutor> WorkerPoolExperts::start(size_t i) {
  const placement::CpuWorkerSpec& spec = opt_.workers[i];
  model::RemoteExpertOptions o = opt_.base;
  o.role = "experts-" + spec.id;
  o.cpus = spec.cpus;
  o.threads = spec.threads > 0 ? spec.threads : static_cast<int>(spec.cpus.size());
  if (o.threads < 1) o.threads = 1;
  o.extra_args = {"--worker-id", spec.id, "--numa-node", std::to_string(spec.numa_node)};
  if (!opt_.coordinator_addr.empty()) {
    o.extra_args.insert(o.extra_args.end(), {"--coordinator", opt_.coordinator_addr});
  }
  if (!opt_.coordinator_addr.empty() && opt_.silence_limit.count() > 0) {
    o.hung = [this, id = spec.id, limit = opt_.silence_limit]() -> std::string {
      const std::chrono::milliseconds silent = registry_.silent_for(id);
      if (silent < limit) return {};
      return "sent no heartbeat for " + std::to_string(silent.count()) +
             " ms (stopped or hung; limit " + std::to_string(limit.count()) + " ms)";
    };
  }
  registry_.expect(spec.id, shm::run_segment_name(o.role));
  auto w = std::make_unique<model::RemoteExpertExecutor>(o);
  if (!opt_.coordinator_addr.empty() &&
      !registry_.wait_registered(spec.id, w->worker_pid(), opt_.register_timeout)) {
    throw Error("CPU worker " + spec.id + " (pid " + std::to_string(w->worker_pid()) +
                ") is ready but did not register with the coordinator at " + opt_.coordinator_addr +
                " within " + std::to_string(opt_.register_timeout.count()) + " ms");
  }
  return w;
}

std::vector<pid_t> WorkerPoolExperts::worker_pids() const {
  std::vector<pid_t> out;
  for (const auto& w : workers_) out.push_back(w ? w->worker_pid() : 0);
  return out;
}

void WorkerPoolExperts::fail(size_t i, const std::exception& e) {
  registry_.mark_dead(opt_.workers[i].id);
  throw WorkerUnavailable("CPU worker " + opt_.workers[i].id + ": " + e.what() +
                          "; it is started again for the next request");
}

void WorkerPoolExperts::ensure_ready() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    if (workers_[i] && workers_[i]->alive()) continue;
    registry_.mark_dead(opt_.workers[i].id);
    workers_[i].reset();  // reaps it and removes its segment before the new one is made
    try {
      workers_[i] = start(i);
    } catch (const std::exception& e) {
      throw WorkerUnavailable("CPU worker " + opt_.workers[i].id +
                              " died and could not be started again: " + e.what());
    }
  }
}

void WorkerPoolExperts::run(int64_t layer, const float* x, int64_t n_tokens,
                            std::span<const model::ExpertItem> items, float* out) {
  const size_t n = workers_.size();
  for (size_t i = 0; i < n; ++i) {
    if (!workers_[i])
      throw WorkerUnavailable("CPU worker " + opt_.workers[i].id + " is not running");
  }
  if (n == 1) {
    try {
      workers_[0]->run(layer, x, n_tokens, items, out);
    } catch (const std::exception& e) {
      if (workers_[0]->dead()) fail(0, e);
      throw;
    }
    return;
  }
  if (n_tokens <= 0) return;
  const int64_t n_embd = opt_.base.n_embd;
  for (auto& v : items_) v.clear();
  for (const model::ExpertItem& it : items) {
    if (it.expert < 0) throw Error("expert executor: negative expert id");
    items_[static_cast<size_t>(it.expert) % n].push_back(it);
  }
  bool all_fit = true;
  for (size_t i = 0; i < n; ++i) {
    out_[i].resize(static_cast<size_t>(n_tokens * n_embd));
    all_fit = all_fit && workers_[i]->fits(n_tokens, static_cast<int64_t>(items_[i].size()));
  }
  size_t failed = n;
  std::string why;
  auto guard = [&](size_t i, auto&& f) {
    if (failed != n) return;
    try {
      f();
    } catch (const std::exception& e) {
      failed = i;
      why = e.what();
    }
  };
  if (all_fit) {
    // Every worker computes at once: ring them all, then wait for each.
    std::vector<bool> submitted(n, false);
    for (size_t i = 0; i < n; ++i) {
      guard(i, [&] {
        workers_[i]->submit(layer, x, n_tokens, items_[i]);
        submitted[i] = true;
      });
    }
    for (size_t i = 0; i < n; ++i) {
      if (!submitted[i]) continue;
      try {
        workers_[i]->collect(out_[i].data());
      } catch (const std::exception& e) {
        if (failed == n) {
          failed = i;
          why = e.what();
        }
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      guard(i, [&] { workers_[i]->run(layer, x, n_tokens, items_[i], out_[i].data()); });
    }
  }
  if (failed != n) {
    const Error e(why);
    if (workers_[failed]->dead()) fail(failed, e);
    throw e;
  }
  const size_t total = static_cast<size_t>(n_tokens * n_embd);
  for (size_t k = 0; k < total; ++k) out[k] = out_[0][k];
  for (size_t i = 1; i < n; ++i) {
    for (size_t k = 0; k < total; ++k) out[k] += out_[i][k];
  }
}

}  // namespace moe::engine
