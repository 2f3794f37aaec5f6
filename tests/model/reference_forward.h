// A deliberately simple qwen3moe forward for tests: every weight dequantized to float, all math in
// double, no KV cache (every call recomputes the whole sequence). Slow and obviously correct.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "common/gguf.h"
#include "experts/model_config.h"

namespace moe::model {

class ReferenceForward {
 public:
  explicit ReferenceForward(const gguf::GgufFile& file);

  const ModelConfig& config() const { return cfg_; }

  struct Result {
    std::vector<double> logits;                 // [n_tokens, n_vocab]
    std::vector<std::vector<int32_t>> experts;  // [layer][n_tokens * n_expert_used]
  };
  // Positions 0..n-1. `force` (optional) overrides the expert choice like ForwardHooks.
  Result run(
      std::span<const int32_t> tokens,
      const std::function<bool(int64_t layer, int64_t pos, int32_t* experts)>& force = {}) const;

 private:
  struct Layer {
    std::vector<float> attn_norm, q_norm, k_norm, ffn_norm, wq, wk, wv, wo, router;
    std::vector<float> gate, up, down;  // all experts, [n_expert][n_out][n_in]
    int64_t n_head = 0, n_head_kv = 0;
  };
  ModelConfig cfg_;
  std::vector<float> tok_embd_, output_norm_, output_;
  std::vector<Layer> layers_;
};

}  // namespace moe::model
