// The seam between the model forward and whoever computes routed experts (DESIGN.md §6): a CPU
// executor in-process today, CUDA and out-of-process workers later.
#pragma once

#include <cstdint>
#include <span>

namespace moe::model {

// One routed (token, expert) pair: `token` indexes the rows of the batch handed to run().
struct ExpertItem {
  int32_t token = 0;
  int32_t expert = 0;
  float weight = 0;
};

class ExpertExecutor {
 public:
  virtual ~ExpertExecutor() = default;
  // out[t] = sum over the items of token t, in item order, of
  //          weight * down_e(silu(gate_e · x[t]) ⊙ up_e · x[t]);
  // x and out are [n_tokens, n_embd]; rows of tokens without items are zero.
  virtual void run(int64_t layer, const float* x, int64_t n_tokens,
                   std::span<const ExpertItem> items, float* out) = 0;
};

}  // namespace moe::model
