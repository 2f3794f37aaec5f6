// gpt-oss with the dense part of every layer on the GPU (-ngl >= n_layer): biased q/k/v/o
// projections, YaRN RoPE, attention with sinks and (on the even layers) a sliding window, norms,
// the biased router and the KV cache in VRAM. The routed experts (MXFP4, biased, SwiGLU-OAI) go
// through RoutedExpertsGpu as qwen3moe's do: VRAM copies on the GPU, the rest on the CPU executor,
// at the same time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/gpu/decode_graphs.h"
#include "coordinator/gpu/gpu_forward.h"
#include "kernels/cpu/rope.h"
#include "kernels/cuda/device_matrix.h"

namespace moe::gpu {

class GptOssGpu final : public GpuForward {
 public:
  // `cpu_experts` computes the experts without a VRAM copy (in-process or worker processes);
  // null = an in-process CPU executor on `pool`.
  GptOssGpu(const gguf::GgufFile& file, cpu::ThreadPool& pool,
            std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt);

  std::string_view name() const override { return "gpt-oss"; }

 private:
  struct Layer {
    VramBuffer attn_norm, post_norm, bq, bk, bv, bo, sinks;
    VramBuffer wqkv_buf, wk_buf, wv_buf, wo_buf, router_buf;
    // q, k and v stacked when their types agree (wk, wv null data otherwise), as Qwen3MoeGpu.
    cuda::DeviceMatrix wqkv, wk, wv, wo, router;
    int64_t n_head = 0, n_head_kv = 0;
    int64_t window = 0;  // sliding-window layers: attention.sliding_window, else 0
  };

  void reserve_layers(int64_t n_tokens) override;
  std::string dense_summary() const override;
  void enqueue_layers(std::span<const SequenceRows> seqs,
                      const model::ForwardHooks* hooks) override {
    enqueue_layers(seqs, nullptr, hooks);
  }
  // device_pos0: the position read on the device, for a graph (one sequence).
  void enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                      const model::ForwardHooks* hooks);
  // q, k, v of n rows with their biases, attention per sequence into d_attn_, o with its bias
  // into d_tmp_.
  void attention_block(const Layer& L, int64_t l, std::span<const SequenceRows> seqs, int64_t n,
                       const int32_t* device_pos0);
  // A one-token step with every expert routed on the device runs from the slot's graph.
  void run_batch(std::span<const int32_t> tokens, int64_t pos0, GpuSequenceStates::Slot& seq,
                 model::LogitsMode mode, float* logits, const model::ForwardHooks* hooks) override;
  void decode_graphed(int32_t token, int64_t pos0, GpuSequenceStates::Slot& seq, float* logits);

  std::vector<Layer> layers_;
  model::RopeYarn yarn_;

  VramBuffer d_qkv_, d_k_, d_v_, d_attn_, d_tmp_, d_rlogits_, d_attn_ws_;
  uint64_t scratch_epoch_ = 0;  // bumped whenever a scratch buffer moves
  DecodeGraphs graphs_{budget_};
};

}  // namespace moe::gpu
