// Causal multi-head attention on the CPU with grouped KV heads, reading K and V from a KvCache of
// any type: softmax(q·K^T * scale + causal mask)·V, everything in f32 (as llama.cpp's non-flash
// path with an F32 cache).
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/model/kv_cache.h"
#include "kernels/cpu/attention_rows.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::model {

struct AttentionShape {
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim_k = 0;
  int64_t head_dim_v = 0;
  float scale = 0;  // usually 1/sqrt(head_dim_k)
  // gpt-oss: > 0, a token at position p sees only positions (p - window, p] (llama.cpp's standard
  // sliding window); 0, every earlier position.
  int64_t window = 0;
  // gpt-oss: n_head sink logits, one per query head, that join each softmax's denominator
  // without a value (null: none).
  const float* sinks = nullptr;
};

// Buffers reused across calls so that steady-state decoding allocates nothing.
struct AttentionScratch {
  std::vector<float> k, v;    // decoded cache rows (non-f32 caches)
  std::vector<float> q;       // the rotated query (rotated K caches)
  std::vector<float> scores;  // per thread, one row of n_kv scores
  // Per thread, prompt batches: a block's query rows, their visible lengths, their outputs.
  struct Block {
    std::vector<float> q, out, sinks;
    std::vector<int64_t> n_vis, first_vis;
    cpu::AttendRowsScratch rows;
  };
  std::vector<Block> blocks;
};

// q: [n_tokens, n_head * head_dim_k]; token i sits at position pos0 + i and attends to cache
// positions [0, pos0 + i] (the last s.window of them with a window). Those rows must already be
// stored in `cache` for `layer`. Where the layer's cache is Hadamard-rotated, q is rotated alike
// and the output rotated back. out: [n_tokens, n_head * head_dim_v]. Prompt batches
// (kBlockPathTokens tokens or more) run blocks of tokens × the query heads of one KV head through
// cpu::attend_rows (each K/V tile read once for the block, online softmax); fewer tokens (decode)
// run one task per (token, head) with a two-pass softmax.
inline constexpr int64_t kBlockPathTokens = 32;
void attention(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const KvCache& cache, int64_t layer, float* out, cpu::ThreadPool& pool,
               AttentionScratch& scratch);

}  // namespace moe::model
