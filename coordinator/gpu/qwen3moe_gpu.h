// qwen3moe with the dense part of every layer on the GPU (-ngl >= n_layer): attention, norms,
// router, output head and the KV cache in VRAM; the routed experts go through RoutedExpertsGpu
// (VRAM copies on the GPU, the rest on the CPU executor, at the same time).
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/gpu/cuda_graph.h"
#include "coordinator/gpu/gpu_options.h"
#include "coordinator/gpu/gpu_sequence_states.h"
#include "coordinator/gpu/pinned_buffer.h"
#include "coordinator/gpu/routed_experts_gpu.h"
#include "coordinator/gpu/token_io_gpu.h"
#include "coordinator/gpu/vram_budget.h"
#include "coordinator/model/model_arch.h"
#include "experts/gpu/gpu_executor.h"
#include "experts/tensor_table.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/device_matrix.h"

namespace moe::gpu {

class Qwen3MoeGpu final : public model::ModelArch {
 public:
  // `cpu_experts` computes the experts without a VRAM copy (in-process or worker processes);
  // null = an in-process CPU executor on `pool`.
  Qwen3MoeGpu(const gguf::GgufFile& file, cpu::ThreadPool& pool,
              std::unique_ptr<model::ExpertExecutor> cpu_experts, const GpuOptions& opt);
  ~Qwen3MoeGpu() override;

  std::string_view name() const override { return "qwen3moe"; }
  const model::ModelConfig& config() const override { return cfg_; }
  // K/V (and recurrent state) live in VRAM: the host cache only names the sequence.
  model::KvStorage cache_storage() const override { return model::KvStorage::None; }
  void forward(std::span<const int32_t> tokens, model::KvCache& cache, model::LogitsMode mode,
               float* logits, const model::ForwardHooks* hooks) override;

  // Device, VRAM use by kind and where the experts live: printed at start.
  std::string describe() const;
  std::string runtime_stats() const override { return experts_->stats(); }
  std::optional<model::ExpertRuntimeStats> expert_runtime() const override {
    return experts_->runtime();
  }

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
  // A decode step replayed from a CUDA graph, and what it was recorded against: a graph holds
  // device addresses, so a change of the sequence's buffers or of the scratch records it again.
  struct DecodeGraph {
    CudaGraph graph;
    const GpuSequenceStates::Slot* slot = nullptr;
    uint64_t slot_generation = 0;
    uint64_t scratch_epoch = 0;
    const void* attention_ws = nullptr;  // an eager step may move it without an epoch
  };

  void ensure_scratch(int64_t n_tokens);
  float* scratch(VramBuffer& b, size_t floats, const char* what);
  // Every layer of an n-token batch at pos0 (device_pos0: read on the device instead, for a
  // graph), enqueued on stream_.
  void enqueue_layers(int64_t n, int64_t pos0, const int32_t* device_pos0,
                      GpuSequenceStates::Slot& seq, const model::ForwardHooks* hooks);
  // A one-token step with every expert routed on the device, from the slot's graph (recorded
  // first when it has none or its buffers changed).
  void decode_graphed(int32_t token, int64_t pos0, GpuSequenceStates::Slot& seq, float* logits);

  model::ModelConfig cfg_;
  GpuOptions opt_;
  std::string device_name_;
  uint64_t vram_limit_ = 0;
  // Before budget_: the budget's buffers come from its allocator and go before it.
  std::unique_ptr<GpuExecutor> executor_;
  VramBudget budget_;
  cudaStream_t stream_ = nullptr;

  std::unique_ptr<TokenIoGpu> io_;  // embeddings in, logits out
  std::vector<Layer> layers_;
  std::unique_ptr<RoutedExpertsGpu> experts_;
  // K/V of the running request and of the health probe the engine interleaves with it.
  GpuSequenceStates seqs_;

  // Device scratch, grow-only.
  int64_t scratch_tokens_ = 0;
  VramBuffer d_x_, d_xn_, d_qkv_, d_k_, d_v_, d_attn_, d_tmp_, d_rlogits_, d_attn_ws_;
  uint64_t scratch_epoch_ = 0;  // bumped whenever a scratch buffer above moves

  // Decode graphs, one per sequence slot; the position they read comes from d_pos_.
  std::vector<std::unique_ptr<DecodeGraph>> graphs_;
  VramBuffer d_pos_;
  PinnedBuffer h_pos_;
};

}  // namespace moe::gpu
