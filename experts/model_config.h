// Hyperparameters of a model, read from GGUF metadata ({arch}.*) and validated once at load time.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf.h"

namespace moe::model {

// How a token's routed experts and their weights come from the router logits.
enum class ExpertGating : uint8_t {
  Softmax,        // softmax over every expert, top k, weights renormalized (qwen3moe, qwen35moe)
  SoftmaxWeight,  // top k by logit, weights = softmax over the k chosen logits (gpt-oss)
};

// An expert's FFN: down(act(gate · x, up · x)).
enum class ExpertActivation : uint8_t {
  SiluGlu,    // silu(g) * u
  SwigluOai,  // gpt-oss: min(g, 7) * sigmoid(1.702 min(g, 7)) * (clamp(u, -7, 7) + 1)
};

enum class RopeScaling : uint8_t { None, Linear, Yarn };

struct ModelConfig {
  std::string arch;                // general.architecture
  int64_t n_layer = 0;             // main layers: {arch}.block_count - nextn_predict_layers
  int64_t n_embd = 0;              // {arch}.embedding_length
  int64_t n_vocab = 0;             // rows of token_embd
  int64_t n_ctx_train = 0;         // {arch}.context_length
  std::vector<int64_t> n_head;     // per layer (the key may be a scalar or an array)
  std::vector<int64_t> n_head_kv;  // per layer; both may be 0 on recurrent layers
  int64_t head_dim_k = 0;          // attention.key_length (default n_embd / n_head)
  int64_t head_dim_v = 0;          // attention.value_length (default n_embd / n_head)
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;  // expert_feed_forward_length
  float rms_eps = 0;
  float rope_freq_base = 10000.0f;
  int64_t n_rot = 0;  // rope.dimension_count (default head_dim_k)

  // Hybrid architectures (qwen35moe); left empty / zero for qwen3moe.
  int64_t n_nextn = 0;                     // nextn_predict_layers (MTP blocks, ignored)
  std::vector<uint8_t> recurrent;          // per main layer: 1 = gated DeltaNet layer (no KV cache)
  int64_t ssm_conv_kernel = 0;             // ssm.conv_kernel (taps, the current token included)
  int64_t ssm_head_k = 0;                  // ssm.state_size: key head dim of the DeltaNet
  int64_t ssm_n_k_heads = 0;               // ssm.group_count
  int64_t ssm_n_v_heads = 0;               // ssm.time_step_rank
  int64_t ssm_inner = 0;                   // ssm.inner_size = n_v_heads * value head dim
  int64_t n_ff_shexp = 0;                  // expert_shared_feed_forward_length
  std::array<int64_t, 4> rope_sections{};  // rope.dimension_sections (IMROPE)

  // gpt-oss; the defaults describe the qwen architectures (no window, no scaling, no biases).
  int64_t n_swa = 0;         // attention.sliding_window (0: none)
  std::vector<uint8_t> swa;  // per main layer: 1 = sliding-window attention; empty = none
  RopeScaling rope_scaling = RopeScaling::None;  // rope.scaling.type
  float rope_scaling_factor = 1.0f;              // rope.scaling.factor
  int64_t rope_n_ctx_orig = 0;    // rope.scaling.original_context_length (default context_length)
  float rope_attn_factor = 1.0f;  // rope.scaling.attn_factor
  float yarn_beta_fast = 32.0f, yarn_beta_slow = 1.0f;  // llama.cpp's defaults
  ExpertGating gating = ExpertGating::Softmax;
  ExpertActivation expert_act = ExpertActivation::SiluGlu;
  bool expert_bias = false;  // ffn_{gate,up,down}_exps.bias and ffn_gate_inp.bias

  bool is_swa(int64_t layer) const { return !swa.empty() && swa[static_cast<size_t>(layer)] != 0; }
  bool is_recurrent(int64_t layer) const {
    return !recurrent.empty() && recurrent[static_cast<size_t>(layer)] != 0;
  }
  bool has_recurrent() const {
    for (uint8_t r : recurrent) {
      if (r != 0) return true;
    }
    return false;
  }
  int64_t ssm_head_v() const { return ssm_n_v_heads ? ssm_inner / ssm_n_v_heads : 0; }
  // Conv channels: q and k (n_k_heads * head_k each), then v (ssm_inner).
  int64_t ssm_conv_channels() const { return 2 * ssm_n_k_heads * ssm_head_k + ssm_inner; }

  int64_t max_n_head() const;
  int64_t max_n_head_kv() const;

  // Reads and validates; throws moe::Error naming the key for missing or inconsistent values.
  static ModelConfig from_gguf(const gguf::GgufFile& file);
};

}  // namespace moe::model
