#include "coordinator/server/control_service.h"

#include <unistd.h>

#include <algorithm>

namespace moe::server {

namespace {

// How long Drain and Shutdown wait without a client deadline.
constexpr std::chrono::seconds kDefaultDrain{60};

v1::WorkerState to_proto(engine::WorkerState s) {
  switch (s) {
    case engine::WorkerState::Starting:
      return v1::WORKER_STATE_STARTING;
    case engine::WorkerState::Ready:
      return v1::WORKER_STATE_READY;
    case engine::WorkerState::Dead:
      return v1::WORKER_STATE_DEAD;
  }
  return v1::WORKER_STATE_UNSPECIFIED;
}

engine::Clock::time_point drain_deadline(const grpc::ServerContext* ctx) {
  using std::chrono::milliseconds;
  auto left =
      std::chrono::duration_cast<milliseconds>(ctx->deadline() - std::chrono::system_clock::now());
  left = std::min<milliseconds>(left, kDefaultDrain);
  return engine::Clock::now() + left * 9 / 10;  // leave the answer time to arrive
}

void to_proto(const model::ExpertPolicy& p, v1::ExpertPolicy& o) {
  o.set_pool_bytes(p.pool_bytes);
  o.set_pool_max_bytes(p.pool_max_bytes);
  o.set_slot_bytes(p.slot_bytes);
  o.set_pool_slots(p.pool_slots);
  o.set_pool_filled(p.pool_filled);
  o.set_stream_share(p.stream_share);
  o.set_direct_share(p.direct_share);
  o.set_prefill_cpu_share(p.prefill_cpu_share);
  o.set_direct_share_now(p.direct_share_now);
  o.set_profiler_new(p.profiler_new);
  o.set_grouping(p.grouping);
  o.set_changes(p.changes);
  o.set_recalibrated_ms(p.recalibrated_ms);
}

grpc::StatusCode code_of(engine::PolicyResult::Status s) {
  switch (s) {
    case engine::PolicyResult::Ok:
      return grpc::StatusCode::OK;
    case engine::PolicyResult::Invalid:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case engine::PolicyResult::Unsupported:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case engine::PolicyResult::NoRoom:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case engine::PolicyResult::Unavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case engine::PolicyResult::Failed:
      return grpc::StatusCode::INTERNAL;
  }
  return grpc::StatusCode::INTERNAL;
}

}  // namespace

ControlService::ControlService(ServingState& state, engine::WorkerRegistry& registry,
                               const placement::Placement& placement, const GrpcAuth& auth,
                               std::function<void()> request_shutdown)
    : state_(state),
      registry_(registry),
      placement_(placement),
      auth_(auth),
      request_shutdown_(std::move(request_shutdown)) {}

grpc::Status ControlService::Register(grpc::ServerContext* ctx, const v1::RegisterRequest* req,
                                      v1::RegisterResponse* resp) {
  if (grpc::Status st = auth_.worker(*ctx); !st.ok()) return st;
  if (req->kind() != v1::WORKER_KIND_CPU) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "only CPU workers are supported"};
  }
  engine::Registration r;
  r.worker_id = req->worker_id();
  r.pid = req->pid();
  r.numa_node = req->numa_node();
  r.cpus.assign(req->cpus().begin(), req->cpus().end());
  r.threads = req->threads();
  r.segment = req->segment();
  r.isa = req->isa();
  const std::string refused = registry_.register_worker(r);
  if (!refused.empty()) return {grpc::StatusCode::FAILED_PRECONDITION, refused};
  resp->set_heartbeat_interval_ms(kHeartbeatIntervalMs);
  resp->set_coordinator_pid(static_cast<int32_t>(::getpid()));
  return grpc::Status::OK;
}

grpc::Status ControlService::Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                                       v1::HeartbeatResponse* resp) {
  if (grpc::Status st = auth_.worker(*ctx); !st.ok()) return st;
  const bool keep =
      registry_.heartbeat(req->worker_id(), req->pid(), req->requests_served(), req->busy_ms());
  resp->set_command(keep ? v1::WORKER_COMMAND_CONTINUE : v1::WORKER_COMMAND_EXIT);
  return grpc::Status::OK;
}

grpc::Status ControlService::GetStats(grpc::ServerContext* ctx, const v1::GetStatsRequest*,
                                      v1::GetStatsResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  const auto now = std::chrono::steady_clock::now();
  resp->set_uptime_s(std::chrono::duration<double>(now - started_).count());
  resp->set_model(state_.model_name);
  if (engine::Engine* eng = state_.engine.load()) {
    const engine::EngineStats s = eng->stats();
    resp->set_requests_accepted(s.accepted);
    resp->set_requests_completed(s.completed);
    resp->set_requests_failed(s.failed);
    resp->set_requests_cancelled(s.cancelled);
    resp->set_requests_rejected(s.rejected);
    resp->set_queue_depth(static_cast<uint32_t>(s.queue_depth));
    resp->set_queue_capacity(static_cast<uint32_t>(s.queue_capacity));
    resp->set_running(s.running);
    resp->set_prompt_tokens(s.prompt_tokens);
    resp->set_generated_tokens(s.generated_tokens);
    resp->set_prompt_ms(s.prompt_ms);
    resp->set_generation_ms(s.generation_ms);
    resp->set_last_tokens_per_second(s.last_tokens_per_second);
    resp->set_draining(s.draining);
    if (s.experts) {
      const model::ExpertRuntimeStats& x = *s.experts;
      v1::ExpertRuntime& o = *resp->mutable_experts();
      o.set_items_vram(x.items_vram);
      o.set_items_pcie(x.items_pcie);
      o.set_items_cpu(x.items_cpu);
      o.set_pcie_bytes(x.pcie_bytes);
      o.set_admitted(x.admitted);
      o.set_evictions(x.evictions);
      o.set_cpu_busy_ms(x.cpu_busy_ms);
      o.set_gpu_busy_ms(x.gpu_busy_ms);
      o.set_pcie_gbps(x.pcie_gbps);
      o.set_cpu_us_per_expert(x.cpu_us_per_expert);
      o.set_gpu_us_per_expert(x.gpu_us_per_expert);
      o.set_vram_used_bytes(x.vram_used_bytes);
      o.set_vram_budget_bytes(x.vram_budget_bytes);
      o.set_gpu_route_wait_ms(x.gpu_route_wait_ms);
      o.set_cpu_route_wait_ms(x.cpu_route_wait_ms);
    }
  }
  if (state_.layers != nullptr && state_.engine.load() != nullptr) {
    const std::vector<engine::LayerCounters> layers = state_.layers->snapshot();
    for (size_t l = 0; l < layers.size(); ++l) {
      v1::LayerStats& o = *resp->add_layers();
      o.set_layer(static_cast<int32_t>(l));
      o.set_calls(layers[l].calls);
      o.set_tokens(layers[l].tokens);
      o.set_routed(layers[l].routed);
      o.set_expert_ms(layers[l].expert_ms);
      o.set_gpu_hits(layers[l].gpu_hits);
      o.set_gpu_misses(layers[l].gpu_misses);
    }
  }
  for (const engine::WorkerRecord& w : registry_.snapshot()) {
    v1::WorkerStats& o = *resp->add_workers();
    o.set_worker_id(w.id);
    o.set_kind(v1::WORKER_KIND_CPU);
    o.set_state(to_proto(w.state));
    o.set_pid(w.pid);
    o.set_restarts(w.restarts);
    o.set_last_heartbeat_age_ms(
        w.heartbeat_seen ? std::chrono::duration<double, std::milli>(now - w.last_heartbeat).count()
                         : -1.0);
    o.set_requests_served(w.requests_served);
    o.set_busy_ms(w.busy_ms);
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::GetPlacement(grpc::ServerContext* ctx, const v1::GetPlacementRequest*,
                                          v1::GetPlacementResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  resp->set_in_process(placement_.in_process);
  resp->set_coordinator_threads(placement_.coordinator_threads);
  resp->set_source(placement_.source);
  resp->set_text(placement_.describe());
  if (engine::Engine* eng = state_.engine.load()) {
    const engine::PolicyResult r = eng->expert_policy({});
    if (r.status != engine::PolicyResult::Ok) return {code_of(r.status), r.message};
    for (const model::LayerSplit& l : r.layers) {
      v1::LayerPlacement& o = *resp->add_layers();
      o.set_layer(static_cast<int32_t>(l.layer));
      o.set_gpu_home(l.gpu_home);
      o.set_vram(static_cast<int32_t>(l.vram));
      o.set_direct(static_cast<int32_t>(l.direct));
      o.set_cpu(static_cast<int32_t>(l.cpu));
    }
  }
  const std::vector<engine::WorkerRecord> live = registry_.snapshot();
  for (const placement::CpuWorkerSpec& spec : placement_.cpu_workers) {
    v1::WorkerPlacement& o = *resp->add_workers();
    o.set_worker_id(spec.id);
    o.set_kind(v1::WORKER_KIND_CPU);
    o.set_numa_node(spec.numa_node);
    for (int c : spec.cpus) o.add_cpus(c);
    o.set_threads(spec.threads);
    for (const engine::WorkerRecord& w : live) {
      if (w.id == spec.id) {
        o.set_pid(w.pid);
        o.set_segment(w.segment);
      }
    }
  }
  return grpc::Status::OK;
}

grpc::Status ControlService::policy(const model::ExpertPolicyChange& change,
                                    v1::ExpertPolicyResponse* resp) {
  engine::Engine* eng = state_.engine.load();
  if (eng == nullptr) return {grpc::StatusCode::UNAVAILABLE, "the coordinator is not serving"};
  const engine::PolicyResult r = eng->expert_policy(change);
  if (r.status != engine::PolicyResult::Ok) return {code_of(r.status), r.message};
  if (!r.policy) {
    return {grpc::StatusCode::FAILED_PRECONDITION, model::kNoExpertPolicy};
  }
  to_proto(*r.policy, *resp->mutable_policy());
  resp->set_apply_ms(r.ms);
  return grpc::Status::OK;
}

grpc::Status ControlService::GetExpertPolicy(grpc::ServerContext* ctx,
                                             const v1::GetExpertPolicyRequest*,
                                             v1::ExpertPolicyResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  return policy({}, resp);
}

grpc::Status ControlService::SetExpertPolicy(grpc::ServerContext* ctx,
                                             const v1::SetExpertPolicyRequest* req,
                                             v1::ExpertPolicyResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  model::ExpertPolicyChange c;
  if (req->has_pool_mib()) c.pool_mib = req->pool_mib();
  if (req->has_stream_share()) c.stream_share = req->stream_share();
  if (req->has_direct_share()) c.direct_share = req->direct_share();
  if (req->has_prefill_cpu_share()) c.prefill_cpu_share = req->prefill_cpu_share();
  if (req->has_profiler_new()) c.profiler_new = req->profiler_new();
  if (req->has_grouping()) c.grouping = req->grouping();
  if (c.empty()) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "nothing to change: set at least one of pool_mib, stream_share, direct_share, "
            "prefill_cpu_share, profiler_new, grouping"};
  }
  return policy(c, resp);
}

grpc::Status ControlService::Recalibrate(grpc::ServerContext* ctx, const v1::RecalibrateRequest*,
                                         v1::ExpertPolicyResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  model::ExpertPolicyChange c;
  c.recalibrate = true;
  return policy(c, resp);
}

grpc::Status ControlService::Drain(grpc::ServerContext* ctx, const v1::DrainRequest*,
                                   v1::DrainResponse* resp) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  engine::Engine* eng = state_.engine.load();
  if (eng == nullptr) return {grpc::StatusCode::UNAVAILABLE, "the coordinator is not serving"};
  resp->set_drained(eng->drain(drain_deadline(ctx)));
  const engine::EngineStats s = eng->stats();
  resp->set_still_running(static_cast<uint32_t>(s.running + s.queue_depth));
  return grpc::Status::OK;
}

grpc::Status ControlService::Shutdown(grpc::ServerContext* ctx, const v1::ShutdownRequest*,
                                      v1::ShutdownResponse*) {
  if (grpc::Status st = auth_.client(*ctx); !st.ok()) return st;
  if (engine::Engine* eng = state_.engine.load()) eng->drain(drain_deadline(ctx));
  request_shutdown_();
  return grpc::Status::OK;
}

}  // namespace moe::server
