// The coordinator's Prometheus metrics (GET /metrics): requests per endpoint and status,
// tokens, time to first token and per-token latency histograms, queue depth, the CPU workers'
// state and busy time, and the routed experts' live policy (GPU forwards). Counters and histograms
// are fed as things happen (the engine through MetricsSink, the HTTP server per response); gauges
// are read from the engine and the worker registry when scraped, and so are the counters whose
// totals are kept there (per-layer work, worker busy time and restarts), which then advance by what
// those totals grew.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <mutex>
#include <string>

#include "coordinator/engine/metrics_sink.h"
#include "coordinator/engine/worker_registry.h"
#include "coordinator/server/serving_state.h"

namespace moe::http {

class Metrics final : public engine::MetricsSink {
 public:
  Metrics();

  void first_token(double seconds) override;
  void token_gap(double seconds) override;
  void job_end(Outcome outcome, int64_t prompt_tokens, int64_t cached_tokens,
               int64_t generated_tokens) override;

  // One HTTP response, by route ("/v1/chat/completions", ...) and status code.
  void http_response(const std::string& route, int status);

  // The text exposition format, with the gauges refreshed from `state` and `registry`.
  std::string scrape(const server::ServingState& state, const engine::WorkerRegistry& registry);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& http_requests_;
  prometheus::Family<prometheus::Counter>& jobs_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& cached_tokens_;
  prometheus::Counter& generated_tokens_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& token_latency_;
  prometheus::Gauge& queue_depth_;
  prometheus::Gauge& queue_capacity_;
  prometheus::Gauge& running_;
  prometheus::Family<prometheus::Gauge>& worker_up_;
  prometheus::Family<prometheus::Counter>& worker_busy_;
  prometheus::Family<prometheus::Counter>& worker_restarts_;
  prometheus::Family<prometheus::Counter>& layer_routed_;
  prometheus::Family<prometheus::Counter>& layer_seconds_;
  prometheus::Family<prometheus::Counter>& layer_hits_;
  prometheus::Family<prometheus::Counter>& layer_misses_;
  prometheus::Family<prometheus::Gauge>& expert_policy_;
  prometheus::Family<prometheus::Counter>& policy_changes_;
  std::mutex scrape_mu_;
};

}  // namespace moe::http
