#include "coordinator/gpu/decode_graphs.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

DecodeGraphs::DecodeGraphs(VramBudget& budget) {
  d_pos_ = budget.allocate(kMaxSequences * sizeof(int32_t), VramUse::Scratch, "decode positions");
  h_pos_.reserve(kMaxSequences * sizeof(int32_t));
}

bool DecodeGraphs::launch(std::span<const Part> parts, int64_t rows_out, uint64_t scratch_epoch,
                          const VramBuffer& attention_ws, cudaStream_t stream,
                          const std::function<void()>& prepare,
                          const std::function<void()>& record) {
  if (parts.empty() || parts.size() > kMaxSequences) {
    throw Error("decode graph: " + std::to_string(parts.size()) + " sequences (1 to " +
                std::to_string(kMaxSequences) + ")");
  }
  auto* pos = h_pos_.get<int32_t>();
  for (size_t i = 0; i < parts.size(); ++i) pos[i] = static_cast<int32_t>(parts[i].pos0);
  MOE_CUDA_CHECK(cudaMemcpyAsync(d_pos_.get(), pos, parts.size() * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, stream));
  // The step's shape: a graph serves exactly the slots, variants and token counts it recorded.
  const auto same_shape = [&](const Graph& g) {
    if (g.slots.size() != parts.size() || g.rows_out != rows_out) return false;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (g.slots[i] != parts[i].slot || g.variants[i] != parts[i].slot->graph_variant() ||
          g.counts[i] != parts[i].n) {
        return false;
      }
    }
    return true;
  };
  Graph* g = nullptr;
  for (auto& c : graphs_) {
    if (same_shape(*c)) g = c.get();
  }
  if (!g) {
    if (graphs_.size() >= kMaxGraphs) {
      const auto oldest =
          std::min_element(graphs_.begin(), graphs_.end(),
                           [](const auto& a, const auto& b) { return a->last_use < b->last_use; });
      graphs_.erase(oldest);
    }
    g = graphs_.emplace_back(std::make_unique<Graph>()).get();
    for (const Part& p : parts) {
      g->slots.push_back(p.slot);
      g->variants.push_back(p.slot->graph_variant());
      g->counts.push_back(p.n);
      g->generations.push_back(0);
    }
    g->rows_out = rows_out;
  }
  g->last_use = ++clock_;
  bool stale = !g->graph.ready() || g->scratch_epoch != scratch_epoch ||
               g->attention_ws != attention_ws.get();
  for (size_t i = 0; i < parts.size(); ++i) {
    stale = stale || g->generations[i] != parts[i].slot->generation();
  }
  if (stale) {
    g->graph.reset();
    prepare();
    g->graph.capture(stream, record);
    for (size_t i = 0; i < parts.size(); ++i) g->generations[i] = parts[i].slot->generation();
    g->scratch_epoch = scratch_epoch;
    g->attention_ws = attention_ws.get();
  }
  g->graph.launch(stream);
  return stale;
}

}  // namespace moe::gpu
