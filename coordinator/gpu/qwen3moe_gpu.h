// qwen3moe with the dense part of every layer on the GPU (-ngl >= n_layer): attention, norms,
// router, output head and the KV cache in VRAM; the routed experts go through RoutedExpertsGpu
// (VRAM copies on the GPU, the rest on the CPU executor, at the same time).
#pragma once

#include <memory>
#include <string>
#include <vector>

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
  void enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                      const model::ForwardHooks* hooks) override;
  bool graphs_supported() const override { return true; }

  std::vector<Layer> layers_;

  // Device scratch, grow-only.
  VramBuffer d_qkv_, d_k_, d_v_, d_attn_, d_tmp_, d_rlogits_;
};

}  // namespace moe::gpu
