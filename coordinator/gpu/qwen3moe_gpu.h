// qwen3moe with the dense part of every layer on the GPU (-ngl >= n_layer): attention, norms,
// router, output head and the KV cache in VRAM. Routed experts run on the GPU when they have a
// VRAM copy (GPU-homed layer or pool slot) and on the CPU executor otherwise, both at once: the
// GPU kernels are enqueued before the CPU computes its share. Routing is decided on the host from
// the router logits, with the same code (and test hooks) as the CPU path.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "coordinator/gpu/expert_residency.h"
#include "coordinator/gpu/gpu_options.h"
#include "coordinator/gpu/pinned_buffer.h"
#include "coordinator/gpu/vram_budget.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/model/tensor_table.h"
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
  void forward(std::span<const int32_t> tokens, model::KvCache& cache, model::LogitsMode mode,
               float* logits, const model::ForwardHooks* hooks) override;

  // Device, VRAM use by kind and where the experts live: printed at start.
  std::string describe() const;

 private:
  struct Layer {
    VramBuffer attn_norm, q_norm, k_norm, ffn_norm;
    VramBuffer wq_buf, wk_buf, wv_buf, wo_buf, router_buf;
    cuda::DeviceMatrix wq, wk, wv, wo, router;
    int64_t n_head = 0, n_head_kv = 0;
  };
  struct KvLayer {
    VramBuffer k, v;
    cuda::DeviceKvLayer view{};
  };
  // K/V in VRAM of the last few sequences (the engine interleaves a one-token health probe with
  // the running request), each tied to the host KvCache that is advanced with it.
  struct SeqSlot {
    const model::KvCache* owner = nullptr;
    int64_t past = 0;  // owner's n_past after our last forward on it
    uint64_t last_use = 0;
    int64_t ctx = 0;
    GgmlType k_type = GgmlType::F16, v_type = GgmlType::F16;
    std::vector<KvLayer> layers;
  };
  cuda::DeviceMatrix upload_matrix(const gguf::TensorInfo& t, VramBuffer& buf, VramUse use);
  VramBuffer upload_vector(const gguf::TensorInfo& t);
  SeqSlot& ensure_kv(const model::KvCache& cache);
  void ensure_scratch(int64_t n_tokens);
  float* scratch(VramBuffer& b, size_t floats, const char* what);
  void run_experts(int64_t layer, int64_t n_tokens, const model::ForwardHooks* hooks);
  bool routes_on_device(int64_t layer, int64_t n_tokens, const model::ForwardHooks* hooks) const;
  void run_experts_on_device(int64_t layer, int64_t n_tokens);
  void maybe_refill_pool();

  model::ModelConfig cfg_;
  cpu::ThreadPool& pool_;
  GpuOptions opt_;
  std::string device_name_;
  VramBudget budget_;
  cudaStream_t stream_ = nullptr;

  model::EmbeddingTensors emb_;  // token_embd stays in RAM, as llama.cpp keeps it
  VramBuffer output_norm_, output_buf_;
  cuda::DeviceMatrix output_{};
  std::vector<Layer> layers_;
  std::vector<model::ExpertLayerTensors> expert_tensors_;
  std::unique_ptr<ExpertResidency> residency_;
  std::unique_ptr<model::ExpertExecutor> cpu_experts_;

  static constexpr size_t kMaxSequences = 2;
  std::vector<SeqSlot> seqs_;
  uint64_t use_clock_ = 0;

  // Device scratch, grow-only.
  int64_t scratch_tokens_ = 0;
  VramBuffer d_x_, d_xn_, d_q_, d_k_, d_v_, d_attn_, d_tmp_, d_rlogits_, d_moe_, d_cpu_out_;
  VramBuffer d_g_, d_u_, d_h_, d_y_, d_meta_, d_logits_, d_attn_ws_;
  // Decode with every expert of the layer in VRAM routes on the device: no host round trip.
  static constexpr int64_t kDeviceRoutingMaxTokens = 4;
  struct DeviceRouting {
    VramBuffer buf;
    float* probs = nullptr;
    float* weights = nullptr;
    int32_t* ids = nullptr;
    int32_t* ident = nullptr;    // 0, 1, 2, ...: one group per item, and the down rows
    int32_t* x_rows = nullptr;   // item i reads token i / k
    int32_t* tok_off = nullptr;  // token t's items start at t * k
    const void** gate = nullptr;
    const void** up = nullptr;
    const void** down = nullptr;
  } dr_;
  // Host side: pinned staging and routing scratch.
  PinnedBuffer h_x_, h_rlogits_, h_xn_, h_cpu_out_, h_meta_;
  std::vector<float> rprobs_, rweights_;
  std::vector<int32_t> rids_, forced_;
  std::vector<model::ExpertItem> cpu_items_;
  std::vector<int32_t> gpu_expert_of_item_;
  int64_t pos0_ = 0;        // position of the batch's first row (for hooks)
  uint64_t refill_at_ = 1;  // routed-token counts at which the pool is refilled
};

}  // namespace moe::gpu
