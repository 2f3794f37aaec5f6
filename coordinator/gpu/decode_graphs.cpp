#include "coordinator/gpu/decode_graphs.h"

#include "kernels/cuda/cuda_check.h"

namespace moe::gpu {

DecodeGraphs::DecodeGraphs(VramBudget& budget) {
  d_pos_ = budget.allocate(sizeof(int32_t), VramUse::Scratch, "decode position");
  h_pos_.reserve(sizeof(int32_t));
}

bool DecodeGraphs::launch(int64_t pos0, GpuSequenceStates::Slot& seq, uint64_t scratch_epoch,
                          const VramBuffer& attention_ws, cudaStream_t stream,
                          const std::function<void()>& prepare,
                          const std::function<void()>& record) {
  *h_pos_.get<int32_t>() = static_cast<int32_t>(pos0);
  MOE_CUDA_CHECK(
      cudaMemcpyAsync(d_pos_.get(), h_pos_.get(), sizeof(int32_t), cudaMemcpyHostToDevice, stream));
  Graph* g = nullptr;
  const int variant = seq.graph_variant();
  for (auto& c : graphs_) {
    if (c->slot == &seq && c->variant == variant) g = c.get();
  }
  if (!g) {
    g = graphs_.emplace_back(std::make_unique<Graph>()).get();
    g->slot = &seq;
    g->variant = variant;
  }
  const bool stale = !g->graph.ready() || g->slot_generation != seq.generation() ||
                     g->scratch_epoch != scratch_epoch || g->attention_ws != attention_ws.get();
  if (stale) {
    g->graph.reset();
    prepare();
    g->graph.capture(stream, record);
    g->slot_generation = seq.generation();
    g->scratch_epoch = scratch_epoch;
    g->attention_ws = attention_ws.get();
  }
  g->graph.launch(stream);
  return stale;
}

}  // namespace moe::gpu
