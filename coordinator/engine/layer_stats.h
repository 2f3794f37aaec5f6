// Per-MoE-layer accounting of the routed experts: how many calls, tokens and (token, expert)
// items each layer sent to its experts and how long they took. The GPU worker will add resident
// hits and misses; until then every routed item is computed on the CPU (a miss).
// InstrumentedExperts wraps any ExpertExecutor to fill it; readers take a snapshot.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "coordinator/model/expert_executor.h"

namespace moe::engine {

struct LayerCounters {
  uint64_t calls = 0, tokens = 0, routed = 0;
  double expert_ms = 0;  // wall time of the layer's expert computation
  uint64_t gpu_hits = 0, gpu_misses = 0;
};

class LayerStats {
 public:
  explicit LayerStats(int64_t n_layer);
  void record(int64_t layer, int64_t tokens, int64_t routed, uint64_t ns);
  std::vector<LayerCounters> snapshot() const;

 private:
  struct Slot {
    std::atomic<uint64_t> calls{0}, tokens{0}, routed{0}, ns{0};
  };
  std::unique_ptr<Slot[]> slots_;
  int64_t n_layer_;
};

class InstrumentedExperts final : public model::ExpertExecutor {
 public:
  InstrumentedExperts(std::unique_ptr<model::ExpertExecutor> inner, LayerStats& stats)
      : inner_(std::move(inner)), stats_(stats) {}
  void run(int64_t layer, const float* x, int64_t n_tokens,
           std::span<const model::ExpertItem> items, float* out) override;

 private:
  std::unique_ptr<model::ExpertExecutor> inner_;
  LayerStats& stats_;
};

}  // namespace moe::engine
