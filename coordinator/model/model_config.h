// Hyperparameters of a model, read from GGUF metadata ({arch}.*) and validated once at load time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/gguf.h"

namespace moe::model {

struct ModelConfig {
  std::string arch;                // general.architecture
  int64_t n_layer = 0;             // {arch}.block_count
  int64_t n_embd = 0;              // {arch}.embedding_length
  int64_t n_vocab = 0;             // rows of token_embd
  int64_t n_ctx_train = 0;         // {arch}.context_length
  std::vector<int64_t> n_head;     // per layer (the key may be a scalar or an array)
  std::vector<int64_t> n_head_kv;  // per layer
  int64_t head_dim_k = 0;          // attention.key_length (default n_embd / n_head)
  int64_t head_dim_v = 0;          // attention.value_length (default n_embd / n_head)
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;  // expert_feed_forward_length
  float rms_eps = 0;
  float rope_freq_base = 10000.0f;
  int64_t n_rot = 0;  // rope.dimension_count (default head_dim_k)

  int64_t max_n_head() const;
  int64_t max_n_head_kv() const;

  // Reads and validates; throws moe::Error naming the key for missing or inconsistent values.
  static ModelConfig from_gguf(const gguf::GgufFile& file);
};

}  // namespace moe::model
