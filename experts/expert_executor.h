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
  // (gpt-oss: each projection plus its expert's bias, and SwiGLU-OAI in place of silu · up);
  // x and out are [n_tokens, n_embd]; rows of tokens without items are zero.
  virtual void run(int64_t layer, const float* x, int64_t n_tokens,
                   std::span<const ExpertItem> items, float* out) = 0;
  // Accounting only, from a GPU forward: of a batch of n_tokens tokens of `layer`, gpu_items
  // items were computed on the GPU and cpu_items go to run() (none when 0). Called before run(),
  // possibly while a previous run() is still going on another thread. Default: ignored.
  virtual void note_split(int64_t layer, int64_t n_tokens, int64_t gpu_items, int64_t cpu_items) {
    (void)layer, (void)n_tokens, (void)gpu_items, (void)cpu_items;
  }
};

}  // namespace moe::model
