// Causal attention of a block of query rows against one KV head, on the CPU: the prompt path of
// model::attention. Rows share the K and V rows they read (the query heads of one KV head, for a
// block of tokens), so each tile of positions is read once for all of them; an online softmax
// runs over the tiles (flash-attention style) and the loops are written to vectorize, compiled
// for AVX-512, AVX2 and baseline x86-64 and picked at load time. Sliding-window rows see only
// their last positions (first_vis), and an attention sink (gpt-oss) is a per-row logit that
// joins the softmax's denominator without a value.
#pragma once

#include <cstdint>
#include <vector>

namespace moe::cpu {

struct AttendRows {
  const float* q = nullptr;  // n_rows query rows of hd_k floats, contiguous
  int64_t n_rows = 0;
  const int64_t* n_vis = nullptr;  // row r sees positions [0, n_vis[r]), n_vis[r] >= 1
  // Optional: row r sees only [first_vis[r], n_vis[r]), first_vis[r] < n_vis[r] (null: from 0).
  const int64_t* first_vis = nullptr;
  // Optional: row r's sink logit, compared unscaled with the scaled scores (null: no sinks).
  const float* sinks = nullptr;
  const float* k = nullptr;  // position p's K row of this head at k + p * k_stride
  const float* v = nullptr;  // likewise V
  int64_t k_stride = 0, v_stride = 0;
  int64_t hd_k = 0, hd_v = 0;
  float scale = 0;
  float* out = nullptr;  // n_rows rows of hd_v floats, contiguous
};

// Per-thread buffers, grown on first use (no allocation in steady state).
struct AttendRowsScratch {
  std::vector<float> scores, m, l;
};

void attend_rows(const AttendRows& a, AttendRowsScratch& scratch);

// The scalar reference: a two-pass softmax per row in double precision.
void attend_rows_ref(const AttendRows& a);

}  // namespace moe::cpu
