// gpt-oss with the dense part of every layer on the GPU (-ngl >= n_layer): biased q/k/v/o
// projections, YaRN RoPE, attention with sinks and (on the even layers) a sliding window, norms,
// the biased router and the KV cache in VRAM. The routed experts (MXFP4, biased, SwiGLU-OAI) go
// through RoutedExpertsGpu as qwen3moe's do: VRAM copies on the GPU, the rest on the CPU executor,
// at the same time.
#pragma once

#include <memory>
#include <string>
#include <vector>

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
  void enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                      const model::ForwardHooks* hooks) override;
  bool graphs_supported() const override { return true; }
  // q, k, v of n rows with their biases, attention per sequence into d_attn_, o with its bias
  // into d_tmp_.
  void attention_block(const Layer& L, int64_t l, std::span<const SequenceRows> seqs, int64_t n,
                       const int32_t* device_pos0);

  std::vector<Layer> layers_;
  model::RopeYarn yarn_;

  VramBuffer d_qkv_, d_k_, d_v_, d_attn_, d_tmp_, d_rlogits_;
};

}  // namespace moe::gpu
