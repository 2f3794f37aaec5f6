#include "coordinator/engine/layer_stats.h"

#include <chrono>

namespace moe::engine {

LayerStats::LayerStats(int64_t n_layer)
    : slots_(std::make_unique<Slot[]>(static_cast<size_t>(n_layer > 0 ? n_layer : 0))),
      n_layer_(n_layer > 0 ? n_layer : 0) {}

void LayerStats::record(int64_t layer, int64_t tokens, int64_t routed, uint64_t ns) {
  if (layer < 0 || layer >= n_layer_) return;
  Slot& s = slots_[static_cast<size_t>(layer)];
  s.calls.fetch_add(1, std::memory_order_relaxed);
  s.tokens.fetch_add(static_cast<uint64_t>(tokens), std::memory_order_relaxed);
  s.routed.fetch_add(static_cast<uint64_t>(routed), std::memory_order_relaxed);
  s.ns.fetch_add(ns, std::memory_order_relaxed);
}

void LayerStats::record_gpu(int64_t layer, int64_t tokens, int64_t gpu_items, bool cpu_ran) {
  if (layer < 0 || layer >= n_layer_) return;
  Slot& s = slots_[static_cast<size_t>(layer)];
  if (!cpu_ran) {
    s.calls.fetch_add(1, std::memory_order_relaxed);
    s.tokens.fetch_add(static_cast<uint64_t>(tokens), std::memory_order_relaxed);
  }
  s.gpu.fetch_add(static_cast<uint64_t>(gpu_items), std::memory_order_relaxed);
}

std::vector<LayerCounters> LayerStats::snapshot() const {
  std::vector<LayerCounters> out(static_cast<size_t>(n_layer_));
  for (int64_t l = 0; l < n_layer_; ++l) {
    const Slot& s = slots_[static_cast<size_t>(l)];
    LayerCounters& c = out[static_cast<size_t>(l)];
    c.calls = s.calls.load(std::memory_order_relaxed);
    c.tokens = s.tokens.load(std::memory_order_relaxed);
    c.gpu_hits = s.gpu.load(std::memory_order_relaxed);
    c.gpu_misses = s.routed.load(std::memory_order_relaxed);  // the CPU's items
    c.routed = c.gpu_hits + c.gpu_misses;
    c.expert_ms = 1e-6 * static_cast<double>(s.ns.load(std::memory_order_relaxed));
  }
  return out;
}

void InstrumentedExperts::run(int64_t layer, const float* x, int64_t n_tokens,
                              std::span<const model::ExpertItem> items, float* out) {
  const auto t0 = std::chrono::steady_clock::now();
  inner_->run(layer, x, n_tokens, items, out);
  const auto ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  stats_.record(layer, n_tokens, static_cast<int64_t>(items.size()), static_cast<uint64_t>(ns));
}

void InstrumentedExperts::note_split(int64_t layer, int64_t n_tokens, int64_t gpu_items,
                                     int64_t cpu_items) {
  stats_.record_gpu(layer, n_tokens, gpu_items, cpu_items > 0);
  inner_->note_split(layer, n_tokens, gpu_items, cpu_items);
}

}  // namespace moe::engine
