// qwen35moe (Qwen3.5 / Qwen3.6-35B-A3B) with the dense part of every layer on the GPU (-ngl >=
// n_layer): the gated DeltaNet layers (projections, causal conv, the recurrence, gated norm) and
// their recurrent state, the gated attention layers and their KV cache, norms, router, shared
// expert and output head in VRAM. The routed experts go through RoutedExpertsGpu exactly as
// qwen3moe's (VRAM copies on the GPU, the rest on the CPU executor, at the same time); the shared
// expert is enqueued first, so the GPU computes it while the CPU works on its share.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "coordinator/gpu/cuda_handles.h"
#include "coordinator/gpu/gpu_forward.h"
#include "kernels/cuda/device_matrix.h"

namespace moe::gpu {

class Qwen35MoeGpu final : public GpuForward {
 public:
  // `cpu_experts` computes the experts without a VRAM copy (in-process or worker processes);
  // null = an in-process CPU executor on `pool`.
  Qwen35MoeGpu(const gguf::GgufFile& file, cpu::ThreadPool& pool,
               std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt);

  std::string_view name() const override { return "qwen35moe"; }

 private:
  struct Matrix {
    VramBuffer buf;
    cuda::DeviceMatrix m{};
  };
  struct Layer {
    bool recurrent = false;
    VramBuffer attn_norm, post_norm;
    // Gated DeltaNet.
    Matrix wqkv, wz, wbeta, walpha, wssm_out;
    VramBuffer conv_w;  // [kernel][channels], tap-major (transposed from the file)
    VramBuffer dt_bias, ssm_a, ssm_norm;
    // Gated attention.
    Matrix wq, wk, wv, wo;
    VramBuffer q_norm, k_norm;
    int64_t n_head = 0, n_head_kv = 0;
    // Router and shared expert.
    Matrix router, sh_gate, sh_up, sh_down, sh_gate_inp;
  };
  void load_layer(const gguf::GgufFile& f, int64_t l, Layer& L);
  Matrix matrix(const gguf::TensorInfo& t);
  void reserve_layers(int64_t n_tokens) override;
  std::string dense_summary() const override;
  void enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                      const model::ForwardHooks* hooks) override;
  // A decode step is captured like qwen3moe's: the attention layers read the position on the
  // device, the DeltaNet layers none, and the shared expert's stream forks and joins inside it.
  bool graphs_supported() const override { return true; }
  // Mixer of layer l on xn (n rows: every sequence's), output in d_mix_. The projections, gates
  // and output run over all rows; the conv, the recurrence and attention per sequence.
  void delta_net_layer(const Layer& L, int64_t l, int64_t n, std::span<const SequenceRows> seqs);
  void attention_layer(const Layer& L, int64_t l, int64_t n, std::span<const SequenceRows> seqs,
                       const int32_t* device_pos0);
  // x = h + routed + sigmoid-gated shared expert of the normalised xn (x holds h on entry).
  void ffn(const Layer& L, int64_t l, int64_t n, int64_t pos0, const model::ForwardHooks* hooks);

  std::vector<Layer> layers_;

  // Device scratch, grow-only.
  VramBuffer d_mix_, d_moe_, d_rlogits_;
  VramBuffer d_qkv_, d_conv_, d_z_, d_ssm_o_, d_beta_, d_gate_;  // DeltaNet
  VramBuffer d_qg_, d_q_, d_og_, d_k_, d_v_, d_attn_;            // attention
  VramBuffer d_sg_, d_su_, d_sh_, d_ss_;                         // shared expert
  // The shared expert runs on a stream of its own, beside the router and the routed experts: on
  // the main stream it delayed every split layer's host round trip (forked after xn, joined
  // before the combine).
  CudaStream shared_stream_;
  CudaEvent xn_ready_, shared_done_;
  std::vector<float> h_trace_, l_out_;  // observe_layer only
};

}  // namespace moe::gpu
