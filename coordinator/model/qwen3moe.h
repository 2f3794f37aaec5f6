// qwen3moe (Qwen3-30B-A3B layout, formats.md §4a): attention with per-head q/k RMSNorm and NEOX
// RoPE, then a softmax-gated top-k MoE FFN with renormalized weights; no shared expert.
#pragma once

#include <memory>
#include <vector>

#include "coordinator/model/attention.h"
#include "coordinator/model/model_arch.h"
#include "experts/cpu_expert_executor.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/matmul.h"

namespace moe::model {

class Qwen3Moe final : public ModelArch {
 public:
  // `experts`: who computes the routed experts; null = a CpuExpertExecutor on `pool`.
  Qwen3Moe(const gguf::GgufFile& file, cpu::ThreadPool& pool,
           std::unique_ptr<ExpertExecutor> experts = nullptr);

  std::string_view name() const override { return "qwen3moe"; }
  const ModelConfig& config() const override { return cfg_; }
  void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsMode mode, float* logits,
               const ForwardHooks* hooks) override;

 private:
  struct Layer {
    std::vector<float> attn_norm, q_norm, k_norm, ffn_norm;
    cpu::WeightMatrix wq, wk, wv, wo, router;
    int64_t n_head = 0, n_head_kv = 0;
  };
  void ensure_scratch(int64_t n_tokens, int64_t n_kv);

  ModelConfig cfg_;
  cpu::ThreadPool& pool_;
  cpu::Isa isa_;
  EmbeddingTensors emb_;
  std::vector<float> output_norm_;
  cpu::WeightMatrix output_;
  std::vector<Layer> layers_;
  std::unique_ptr<ExpertExecutor> experts_;

  // Grow-only scratch: steady-state decoding allocates nothing.
  cpu::MatmulScratch mm_;
  AttentionScratch attn_scratch_;
  std::vector<float> x_, xn_, q_, k_, v_, attn_, tmp_, rlogits_, rprobs_, rweights_, moe_out_;
  std::vector<float> rope_cs_;
  std::vector<int32_t> rids_, forced_;
  std::vector<ExpertItem> items_;
};

}  // namespace moe::model
