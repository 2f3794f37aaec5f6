// qwen3moe (Qwen3-30B-A3B layout, formats.md §4a): attention with per-head q/k RMSNorm and NEOX
// RoPE, then a softmax-gated top-k MoE FFN with renormalized weights; no shared expert.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "coordinator/model/attention.h"
#include "coordinator/model/cpu_forward.h"

namespace moe::model {

class Qwen3Moe final : public CpuForward {
 public:
  // `experts`: who computes the routed experts; null = a CpuExpertExecutor on `pool`.
  Qwen3Moe(const gguf::GgufFile& file, cpu::ThreadPool& pool,
           std::unique_ptr<ExpertExecutor> experts = nullptr);

  std::string_view name() const override { return "qwen3moe"; }

 private:
  struct Layer {
    std::vector<float> attn_norm, q_norm, k_norm, ffn_norm;
    cpu::WeightMatrix wq, wk, wv, wo, router;
    int64_t n_head = 0, n_head_kv = 0;
  };
  void reserve_layers(int64_t n_tokens) override;
  void run_layers(int64_t n, std::span<const SequenceRows> seqs,
                  const ForwardHooks* hooks) override;

  std::vector<Layer> layers_;

  // Grow-only scratch: steady-state decoding allocates nothing.
  AttentionScratch attn_scratch_;
  std::vector<float> q_, k_, v_, attn_, tmp_, moe_out_, rope_cs_;
};

}  // namespace moe::model
