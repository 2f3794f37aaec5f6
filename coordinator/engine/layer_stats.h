// Per-MoE-layer accounting of the routed experts: how many batches, tokens and (token, expert)
// items each layer routed, how many of the items the GPU computed (hits: VRAM copies and experts
// copied over PCIe) and the CPU (misses), and how long the CPU's part took. InstrumentedExperts
// wraps the CPU's ExpertExecutor to fill it (a GPU forward reports its part via note_split);
// readers take a snapshot. Without a GPU every item is a miss.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "experts/expert_executor.h"

namespace moe::engine {

struct LayerCounters {
  uint64_t calls = 0, tokens = 0, routed = 0;
  double expert_ms = 0;  // wall time of the layer's expert computation
  uint64_t gpu_hits = 0, gpu_misses = 0;
};

class LayerStats {
 public:
  explicit LayerStats(int64_t n_layer);
  // The CPU computed `routed` items of a batch of `tokens` tokens in `ns`.
  void record(int64_t layer, int64_t tokens, int64_t routed, uint64_t ns);
  // The GPU computed `gpu_items` items of a batch; `cpu_ran`: the CPU's record() counts the batch.
  void record_gpu(int64_t layer, int64_t tokens, int64_t gpu_items, bool cpu_ran);
  std::vector<LayerCounters> snapshot() const;

 private:
  struct Slot {
    std::atomic<uint64_t> calls{0}, tokens{0}, routed{0}, ns{0}, gpu{0};
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
  void note_split(int64_t layer, int64_t n_tokens, int64_t gpu_items, int64_t cpu_items) override;

 private:
  std::unique_ptr<model::ExpertExecutor> inner_;
  LayerStats& stats_;
};

}  // namespace moe::engine
