// gpt-oss (OpenAI gpt-oss-20b/120b as llama.cpp's LLM_ARCH_OPENAI_MOE runs them): attention with
// q/k/v/o biases, NEOX RoPE with YaRN scaling, a per-head attention sink and a sliding window on
// the layers the pattern marks (the even ones by default), then top-k experts chosen by biased
// router logits with softmax weights over the chosen, each expert a biased SwiGLU-OAI FFN.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "coordinator/model/attention.h"
#include "coordinator/model/cpu_forward.h"
#include "kernels/cpu/rope.h"

namespace moe::model {

class GptOss final : public CpuForward {
 public:
  // `experts`: who computes the routed experts; null = a CpuExpertExecutor on `pool`.
  GptOss(const gguf::GgufFile& file, cpu::ThreadPool& pool,
         std::unique_ptr<ExpertExecutor> experts = nullptr);

  std::string_view name() const override { return "gpt-oss"; }
  // Context shift re-ropes K with the YaRN frequencies (kv_shift.h).
  void shift_context(KvCache& cache, int64_t n_keep, int64_t n_discard) override;

 private:
  struct Layer {
    std::vector<float> attn_norm, post_norm;
    cpu::WeightMatrix wq, wk, wv, wo, router;
    std::vector<float> bq, bk, bv, bo, sinks, router_b;
    int64_t n_head = 0, n_head_kv = 0;
  };
  void reserve_layers(int64_t n_tokens) override;
  void run_layers(int64_t n, std::span<const SequenceRows> seqs,
                  const ForwardHooks* hooks) override;
  void attention_block(const Layer& L, int64_t l, int64_t n, std::span<const SequenceRows> seqs);

  std::vector<Layer> layers_;
  RopeYarn rope_;

  // Grow-only scratch: steady-state decoding allocates nothing.
  AttentionScratch attn_scratch_;
  std::vector<float> q_, k_, v_, attn_, tmp_, moe_out_, rope_cs_;
};

}  // namespace moe::model
