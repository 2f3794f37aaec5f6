#include "coordinator/http/metrics.h"

#include <prometheus/text_serializer.h>

namespace moe::http {

namespace {

// Seconds: a token every few ms on a big machine, seconds for a long prompt on a small one.
prometheus::Histogram::BucketBoundaries latency_buckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

// A counter mirroring a running total kept elsewhere: advanced by what the total grew since the
// last scrape. Never moved back, so a total that shrank (it should not) cannot break rate().
void advance_to(prometheus::Counter& c, double total) {
  const double delta = total - c.Value();
  if (delta > 0) c.Increment(delta);
}

}  // namespace

Metrics::Metrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      http_requests_(prometheus::BuildCounter()
                         .Name("moe_http_requests_total")
                         .Help("HTTP responses by route and status code")
                         .Register(*registry_)),
      jobs_(prometheus::BuildCounter()
                .Name("moe_requests_total")
                .Help("Generation requests that ran, by outcome (gRPC and HTTP)")
                .Register(*registry_)),
      prompt_tokens_(prometheus::BuildCounter()
                         .Name("moe_prompt_tokens_total")
                         .Help("Prompt tokens evaluated")
                         .Register(*registry_)
                         .Add({})),
      cached_tokens_(prometheus::BuildCounter()
                         .Name("moe_prompt_cached_tokens_total")
                         .Help("Prompt tokens taken from the prompt cache instead of evaluated")
                         .Register(*registry_)
                         .Add({})),
      generated_tokens_(prometheus::BuildCounter()
                            .Name("moe_generated_tokens_total")
                            .Help("Tokens generated")
                            .Register(*registry_)
                            .Add({})),
      ttft_(prometheus::BuildHistogram()
                .Name("moe_time_to_first_token_seconds")
                .Help("From acceptance (queue included) to the first generated token")
                .Register(*registry_)
                .Add({}, latency_buckets())),
      token_latency_(prometheus::BuildHistogram()
                         .Name("moe_token_latency_seconds")
                         .Help("Between consecutive generated tokens of a request")
                         .Register(*registry_)
                         .Add({}, latency_buckets())),
      queue_depth_(prometheus::BuildGauge()
                       .Name("moe_queue_depth")
                       .Help("Requests waiting")
                       .Register(*registry_)
                       .Add({})),
      queue_capacity_(prometheus::BuildGauge()
                          .Name("moe_queue_capacity")
                          .Help("Requests that may wait before new ones get 429")
                          .Register(*registry_)
                          .Add({})),
      running_(prometheus::BuildGauge()
                   .Name("moe_requests_running")
                   .Help("Requests being generated")
                   .Register(*registry_)
                   .Add({})),
      worker_up_(prometheus::BuildGauge()
                     .Name("moe_worker_up")
                     .Help("1 while the worker is registered and alive")
                     .Register(*registry_)),
      // Busy time adds up the worker's processes: a restart does not take it back.
      worker_busy_(prometheus::BuildCounter()
                       .Name("moe_worker_busy_seconds_total")
                       .Help("Time the worker spent computing experts (CPU busy time), over its "
                             "restarts")
                       .Register(*registry_)),
      worker_restarts_(prometheus::BuildCounter()
                           .Name("moe_worker_restarts_total")
                           .Help("Times the worker was started again after dying")
                           .Register(*registry_)),
      // Running totals in LayerStats, read at scrape time.
      layer_routed_(prometheus::BuildCounter()
                        .Name("moe_layer_routed_items_total")
                        .Help("(token, expert) items routed in the layer")
                        .Register(*registry_)),
      layer_seconds_(prometheus::BuildCounter()
                         .Name("moe_layer_expert_seconds_total")
                         .Help("Wall time of the layer's expert computation")
                         .Register(*registry_)),
      layer_hits_(prometheus::BuildCounter()
                      .Name("moe_layer_gpu_hits_total")
                      .Help("Items computed by GPU-resident experts (0 without a GPU worker)")
                      .Register(*registry_)),
      layer_misses_(prometheus::BuildCounter()
                        .Name("moe_layer_gpu_misses_total")
                        .Help("Items computed on the CPU; hit rate = hits / (hits + misses)")
                        .Register(*registry_)),
      expert_policy_(prometheus::BuildGauge()
                         .Name("moe_expert_policy")
                         .Help("The routed experts' live policy by setting (GPU forwards): "
                               "pool_bytes, pool_slots, pool_filled; shares 0..1 or -1 for "
                               "auto; profiler_new and grouping 0 or 1")
                         .Register(*registry_)),
      policy_changes_(prometheus::BuildCounter()
                          .Name("moe_expert_policy_changes_total")
                          .Help("Changes of the experts' live policy applied (SetExpertPolicy, "
                                "Recalibrate)")
                          .Register(*registry_)) {}

void Metrics::first_token(double seconds) { ttft_.Observe(seconds); }

void Metrics::token_gap(double seconds) { token_latency_.Observe(seconds); }

void Metrics::job_end(Outcome outcome, int64_t prompt_tokens, int64_t cached_tokens,
                      int64_t generated_tokens) {
  const char* name = outcome == Outcome::Ok          ? "ok"
                     : outcome == Outcome::Cancelled ? "cancelled"
                                                     : "failed";
  jobs_.Add({{"outcome", name}}).Increment();
  prompt_tokens_.Increment(static_cast<double>(prompt_tokens));
  cached_tokens_.Increment(static_cast<double>(cached_tokens));
  generated_tokens_.Increment(static_cast<double>(generated_tokens));
}

void Metrics::http_response(const std::string& route, int status) {
  http_requests_.Add({{"route", route}, {"code", std::to_string(status)}}).Increment();
}

std::string Metrics::scrape(const server::ServingState& state,
                            const engine::WorkerRegistry& registry) {
  std::lock_guard lock(scrape_mu_);
  if (engine::Engine* eng = state.engine.load()) {
    const engine::EngineStats s = eng->stats();
    queue_depth_.Set(static_cast<double>(s.queue_depth));
    queue_capacity_.Set(static_cast<double>(s.queue_capacity));
    running_.Set(s.running);
    if (s.policy) {
      const model::ExpertPolicy& p = *s.policy;
      const auto set = [&](const char* setting, double v) {
        expert_policy_.Add({{"setting", setting}}).Set(v);
      };
      set("pool_bytes", static_cast<double>(p.pool_bytes));
      set("pool_slots", static_cast<double>(p.pool_slots));
      set("pool_filled", static_cast<double>(p.pool_filled));
      set("stream_share", p.stream_share);
      set("direct_share", p.direct_share);
      set("direct_share_now", p.direct_share_now);
      set("prefill_cpu_share", p.prefill_cpu_share);
      set("profiler_new", p.profiler_new ? 1 : 0);
      set("grouping", p.grouping ? 1 : 0);
      advance_to(policy_changes_.Add({}), static_cast<double>(p.changes));
    }
  }
  if (state.layers != nullptr && state.engine.load() != nullptr) {
    const std::vector<engine::LayerCounters> layers = state.layers->snapshot();
    for (size_t l = 0; l < layers.size(); ++l) {
      const prometheus::Labels labels{{"layer", std::to_string(l)}};
      advance_to(layer_routed_.Add(labels), static_cast<double>(layers[l].routed));
      advance_to(layer_seconds_.Add(labels), layers[l].expert_ms / 1e3);
      advance_to(layer_hits_.Add(labels), static_cast<double>(layers[l].gpu_hits));
      advance_to(layer_misses_.Add(labels), static_cast<double>(layers[l].gpu_misses));
    }
  }
  for (const engine::WorkerRecord& w : registry.snapshot()) {
    const prometheus::Labels labels{{"worker", w.id}, {"kind", "cpu"}};
    worker_up_.Add(labels).Set(w.state == engine::WorkerState::Ready ? 1 : 0);
    advance_to(worker_busy_.Add(labels), (w.busy_ms_before + w.busy_ms) / 1e3);
    advance_to(worker_restarts_.Add(labels), w.restarts);
  }
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace moe::http
