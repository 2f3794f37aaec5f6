// The generation loop over a ModelArch and one sequence's KvCache: the prompt as one batch, then
// one token at a time. Token choice is a callback so a sampler can replace greedy argmax.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "coordinator/model/model_arch.h"

namespace moe::model {

// Index of the largest logit; ties go to the lowest id.
int32_t argmax(std::span<const float> logits);

// Evaluates the prompt as one batch at the cache's current position; logits of every position,
// row-major [n_prompt, n_vocab].
std::vector<float> evaluate_batch(ModelArch& model, KvCache& cache, std::span<const int32_t> tokens,
                                  const ForwardHooks* hooks = nullptr);

struct GenerateOptions {
  int64_t n_steps = 0;       // tokens to choose
  bool keep_logits = false;  // return the logits of every step
  // Picks the next token from a logits row; empty means greedy argmax.
  std::function<int32_t(std::span<const float> logits)> pick;
  // Called with every chosen token; return false to stop after it.
  std::function<bool(int32_t token)> on_token;
  const ForwardHooks* hooks = nullptr;
};

struct GenerateResult {
  std::vector<int32_t> tokens;
  std::vector<float> logits;  // [tokens.size(), n_vocab] when keep_logits: the row each token was
                              // chosen from (row 0 = the last prompt position)
};

// Evaluates `prompt` (one batch), then chooses n_steps tokens; each chosen token except the last
// is decoded alone with the KV cache to produce the next row.
GenerateResult generate(ModelArch& model, KvCache& cache, std::span<const int32_t> prompt,
                        const GenerateOptions& opt);

}  // namespace moe::model
