// Engine::expert_policy: the routed experts' live policy, read and changed on the scheduler
// thread between steps (issue 29 §4).
#include <chrono>

#include "coordinator/engine/engine.h"

namespace moe::engine {

namespace {

PolicyResult::Status status_of(model::PolicyOutcome::Kind k) {
  switch (k) {
    case model::PolicyOutcome::Applied:
      return PolicyResult::Ok;
    case model::PolicyOutcome::Unsupported:
      return PolicyResult::Unsupported;
    case model::PolicyOutcome::NoRoom:
      return PolicyResult::NoRoom;
    case model::PolicyOutcome::Failed:
      return PolicyResult::Failed;
  }
  return PolicyResult::Failed;
}

}  // namespace

PolicyResult Engine::expert_policy(const model::ExpertPolicyChange& change) {
  const Clock::time_point t0 = Clock::now();
  if (std::string why = model::validate(change); !why.empty()) {
    return {PolicyResult::Invalid, std::move(why)};
  }
  auto task = std::make_shared<PolicyTask>();
  task->change = change;
  std::future<PolicyResult> done = task->result.get_future();
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      return {PolicyResult::Unavailable, "the server is stopping"};
    }
    policy_tasks_.push_back(task);
  }
  cv_.notify_all();
  PolicyResult r = done.get();  // the scheduler answers every task, at the latest when it stops
  r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return r;
}

void Engine::run_policy_tasks() {
  std::vector<std::shared_ptr<PolicyTask>> tasks;
  {
    std::lock_guard lock(mu_);
    tasks.swap(policy_tasks_);
  }
  if (tasks.empty()) return;
  for (auto& t : tasks) {
    PolicyResult r;
    try {
      if (!t->change.empty()) {
        model::PolicyOutcome o = model_.set_expert_policy(t->change);
        r.status = status_of(o.kind);
        r.message = std::move(o.message);
      }
      r.policy = model_.expert_policy();
      r.layers = model_.layer_split();
    } catch (const std::exception& e) {
      r.status = PolicyResult::Failed;
      r.message = e.what();
    }
    if (r.policy) {
      std::lock_guard lock(mu_);
      stats_.policy = r.policy;  // /metrics shows the change by the time the caller has its answer
    }
    t->result.set_value(std::move(r));
  }
}

}  // namespace moe::engine
