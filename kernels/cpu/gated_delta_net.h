// The gated DeltaNet recurrence of qwen35moe's linear-attention layers, token by token as
// llama.cpp's fused ggml_gated_delta_net op computes it, in F32.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace moe::model {

struct GatedDeltaNetShape {
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;  // a multiple of n_k_heads
  int64_t head_k = 0;
  int64_t head_v = 0;
};

// Per value head h, which reads key head h % n_k_heads (the converter's tiled order), with state
// S_h [head_v][head_k] and per token t:
//   S ← exp(g)·S;  d = β·(v − S·k);  S ← S + d·kᵀ;  o = (S·q) / sqrt(head_k)
// q, k: row t at q + t * stride (k likewise), n_k_heads heads of head_k, L2-normalised; v: row t
// at v + t * stride, n_v_heads heads of head_v. g (log-decay, <= 0) and beta:
// [n_tokens][n_v_heads]. state_in: [n_v_heads][head_v][head_k], or null for zeros; state_out: the
// state after the last token, same layout, not aliasing state_in. out: [n_tokens][n_v_heads *
// head_v]. Rows of a state are independent, so the pool's tasks are (head, block of rows) and each
// keeps its block in L1 over the whole batch; results do not depend on the thread count.
void gated_delta_net(const GatedDeltaNetShape& s, const float* q, const float* k, const float* v,
                     int64_t stride, const float* g, const float* beta, int64_t n_tokens,
                     const float* state_in, float* state_out, float* out, cpu::ThreadPool& pool);

}  // namespace moe::model
