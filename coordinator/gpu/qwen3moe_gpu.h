// qwen3moe with the dense part of every layer on the GPU (-ngl >= n_layer): attention, norms,
// router, output head and the KV cache in VRAM; the routed experts go through RoutedExpertsGpu
// (VRAM copies on the GPU, the rest on the CPU executor, at the same time).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/gpu/decode_graphs.h"
#include "coordinator/gpu/gpu_forward.h"
#include "kernels/cuda/device_matrix.h"

namespace moe::gpu {

class Qwen3MoeGpu final : public GpuForward {
 public:
  // `cpu_experts` computes the experts without a VRAM copy (in-process or worker processes);
  // null = an in-process CPU executor on `pool`.
  Qwen3MoeGpu(const gguf::GgufFile& file, cpu::ThreadPool& pool,
              std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt);

  std::string_view name() const override { return "qwen3moe"; }

 private:
  struct Layer {
    VramBuffer attn_norm, q_norm, k_norm, ffn_norm;
    VramBuffer wqkv_buf, wk_buf, wv_buf, wo_buf, router_buf;
    // q, k and v stacked, one launch for the three (k and v alone are latency-bound). k and v
    // stay apart (wk, wv; null data otherwise) when their types differ from q's, as the Q4_K_M
    // mixes' Q6_K attn_v layers do.
    cuda::DeviceMatrix wqkv, wk, wv, wo, router;
    int64_t n_head = 0, n_head_kv = 0;
  };
  void reserve_layers(int64_t n_tokens) override;
  std::string dense_summary() const override;
  void enqueue_layers(std::span<const SequenceRows> seqs,
                      const model::ForwardHooks* hooks) override {
    enqueue_layers(seqs, nullptr, hooks);
  }
  // device_pos0: the position read on the device instead of seqs[0].pos0, for a graph (one
  // sequence).
  void enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                      const model::ForwardHooks* hooks);
  // A one-token step with every expert routed on the device runs from the slot's graph.
  void run_batch(std::span<const int32_t> tokens, int64_t pos0, GpuSequenceStates::Slot& seq,
                 model::LogitsMode mode, float* logits, const model::ForwardHooks* hooks) override;
  // Recorded first when the slot has no graph or its buffers changed.
  void decode_graphed(int32_t token, int64_t pos0, GpuSequenceStates::Slot& seq, float* logits);

  std::vector<Layer> layers_;

  // Device scratch, grow-only.
  VramBuffer d_qkv_, d_k_, d_v_, d_attn_, d_tmp_, d_rlogits_, d_attn_ws_;
  uint64_t scratch_epoch_ = 0;  // bumped whenever a scratch buffer moves

  DecodeGraphs graphs_{budget_};  // one per sequence slot
};

}  // namespace moe::gpu
