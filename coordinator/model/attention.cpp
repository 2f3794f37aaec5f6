#include "coordinator/model/attention.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/hadamard.h"

namespace moe::model {
namespace {

// Eight independent partial sums let the compiler vectorize without reassociating floats.
float dot_f32(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = 0;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int j = 0; j < 8; ++j) sum += acc[j];
  return sum;
}

// The first position a token at `pos` sees.
int64_t first_visible(const AttentionShape& s, int64_t pos) {
  return s.window > 0 ? std::max<int64_t>(0, pos - s.window + 1) : 0;
}

// Prompt batches: a task is a block of tokens × the `group` query heads of one KV head, run as
// contiguous rows through cpu::attend_rows; blocks ending later (more positions) go first. Row j
// of K and V is position lo + j.
void attend_blocks(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
                   int64_t lo, const float* K, const float* V, int64_t k_stride, int64_t v_stride,
                   int64_t v_rot, float* out, cpu::ThreadPool& pool, AttentionScratch& scratch) {
  const int64_t group = s.n_head / s.n_head_kv;
  const int64_t block_tokens = std::max<int64_t>(1, 64 / group);  // about 64 rows per task
  const int64_t n_blocks = (n_tokens + block_tokens - 1) / block_tokens;
  if (scratch.blocks.size() < static_cast<size_t>(pool.size())) {
    scratch.blocks.resize(static_cast<size_t>(pool.size()));
  }
  pool.parallel_for(n_blocks * s.n_head_kv, [&](int64_t task, int thread) {
    const int64_t b = n_blocks - 1 - task / s.n_head_kv, hk = task % s.n_head_kv;
    const int64_t t0 = b * block_tokens, nt = std::min(block_tokens, n_tokens - t0);
    const int64_t rows = nt * group;
    AttentionScratch::Block& bl = scratch.blocks[static_cast<size_t>(thread)];
    if (bl.q.size() < static_cast<size_t>(rows * s.head_dim_k)) {
      bl.q.resize(static_cast<size_t>(rows * s.head_dim_k));
    }
    if (bl.out.size() < static_cast<size_t>(rows * s.head_dim_v)) {
      bl.out.resize(static_cast<size_t>(rows * s.head_dim_v));
    }
    if (bl.n_vis.size() < static_cast<size_t>(rows)) {
      bl.n_vis.resize(static_cast<size_t>(rows));
      bl.first_vis.resize(static_cast<size_t>(rows));
      bl.sinks.resize(static_cast<size_t>(rows));
    }
    // Row r is token t0 + r / group, query head hk * group + r % group: a token's rows are its
    // group of heads, side by side in q and in out.
    const int64_t qw = group * s.head_dim_k, ow = group * s.head_dim_v;
    for (int64_t i = 0; i < nt; ++i) {
      const float* src = q + (t0 + i) * s.n_head * s.head_dim_k + hk * qw;
      std::copy(src, src + qw, bl.q.data() + i * qw);
      const int64_t pos = pos0 + t0 + i;
      std::fill_n(bl.n_vis.data() + i * group, group, pos + 1 - lo);
      std::fill_n(bl.first_vis.data() + i * group, group, first_visible(s, pos) - lo);
      if (s.sinks) std::copy_n(s.sinks + hk * group, group, bl.sinks.data() + i * group);
    }
    cpu::AttendRows a;
    a.q = bl.q.data();
    a.n_rows = rows;
    a.n_vis = bl.n_vis.data();
    if (s.window > 0) a.first_vis = bl.first_vis.data();
    if (s.sinks) a.sinks = bl.sinks.data();
    a.k = K + hk * s.head_dim_k;
    a.v = V + hk * s.head_dim_v;
    a.k_stride = k_stride;
    a.v_stride = v_stride;
    a.hd_k = s.head_dim_k;
    a.hd_v = s.head_dim_v;
    a.scale = s.scale;
    a.out = bl.out.data();
    cpu::attend_rows(a, bl.rows);
    for (int64_t i = 0; i < nt; ++i) {
      float* o = out + (t0 + i) * s.n_head * s.head_dim_v + hk * ow;
      std::copy(bl.out.data() + i * ow, bl.out.data() + (i + 1) * ow, o);
      // A rotated V cache gives H·out; H is its own inverse (blocks of v_rot divide each head).
      if (v_rot > 0) cpu::hadamard_blocks(o, ow, v_rot);
    }
  });
}

}  // namespace

void attention(const AttentionShape& s, const float* q, int64_t n_tokens, int64_t pos0,
               const KvCache& cache, int64_t layer, float* out, cpu::ThreadPool& pool,
               AttentionScratch& scratch) {
  const int64_t n_kv = pos0 + n_tokens;
  // Only the positions some token of the batch sees are read: with a window, from the first
  // token's first visible one. Row j of K and V below is position lo + j.
  const int64_t lo = first_visible(s, pos0), n_rows = n_kv - lo;
  const int64_t k_stride = s.n_head_kv * s.head_dim_k;
  const int64_t v_stride = s.n_head_kv * s.head_dim_v;
  const float* K = cache.k_f32(layer);
  const float* V = cache.v_f32(layer);
  if (K) K += lo * k_stride;
  if (V) V += lo * v_stride;
  // A rotated K cache holds H·k: the query is rotated alike, so q·k is unchanged.
  const int64_t k_rot = cache.k_rotation(layer), v_rot = cache.v_rotation(layer);
  if (k_rot > 0) {
    const auto n = static_cast<size_t>(n_tokens * s.n_head * s.head_dim_k);
    if (scratch.q.size() < n) scratch.q.resize(n);
    std::copy(q, q + n, scratch.q.begin());
    cpu::hadamard_blocks(scratch.q.data(), static_cast<int64_t>(n), k_rot);
    q = scratch.q.data();
  }
  // Non-f32 caches are decoded once per call; rows are split among the threads.
  constexpr int64_t kRowsPerTask = 64;
  const int64_t n_row_tasks = (n_rows + kRowsPerTask - 1) / kRowsPerTask;
  if (!K) {
    if (scratch.k.size() < static_cast<size_t>(n_rows * k_stride)) {
      scratch.k.resize(static_cast<size_t>(n_rows * k_stride));
    }
    pool.parallel_for(n_row_tasks, [&](int64_t t, int) {
      const int64_t p = t * kRowsPerTask, n = std::min(kRowsPerTask, n_rows - p);
      cache.read_k(layer, lo + p, n, scratch.k.data() + p * k_stride);
    });
    K = scratch.k.data();
  }
  if (!V) {
    if (scratch.v.size() < static_cast<size_t>(n_rows * v_stride)) {
      scratch.v.resize(static_cast<size_t>(n_rows * v_stride));
    }
    pool.parallel_for(n_row_tasks, [&](int64_t t, int) {
      const int64_t p = t * kRowsPerTask, n = std::min(kRowsPerTask, n_rows - p);
      cache.read_v(layer, lo + p, n, scratch.v.data() + p * v_stride);
    });
    V = scratch.v.data();
  }
  const int64_t group = s.n_head / s.n_head_kv;  // query heads per KV head
  if (n_tokens >= kBlockPathTokens) {
    attend_blocks(s, q, n_tokens, pos0, lo, K, V, k_stride, v_stride, v_rot, out, pool, scratch);
    return;
  }
  // A row of scores per thread, as long as the cache can grow (decoding adds a position a step,
  // and must not reallocate each time).
  const auto per_thread = static_cast<size_t>(std::max(n_kv, cache.n_ctx()));
  if (scratch.scores.size() < per_thread * static_cast<size_t>(pool.size())) {
    scratch.scores.resize(per_thread * static_cast<size_t>(pool.size()));
  }
  pool.parallel_for(n_tokens * s.n_head, [&](int64_t task, int thread) {
    const int64_t i = task / s.n_head, h = task % s.n_head, hk = h / group;
    const float* qi = q + i * s.n_head * s.head_dim_k + h * s.head_dim_k;
    float* sc = scratch.scores.data() + static_cast<size_t>(thread) * per_thread;
    const int64_t n_vis = pos0 + i + 1;  // causal: positions 0..pos0+i
    const int64_t j0 = first_visible(s, pos0 + i);
    // A sink joins the max and the denominator as llama.cpp's softmax does.
    float max = s.sinks ? s.sinks[h] : -INFINITY;
    for (int64_t j = j0; j < n_vis; ++j) {
      sc[j] = dot_f32(qi, K + (j - lo) * k_stride + hk * s.head_dim_k, s.head_dim_k) * s.scale;
      max = std::max(max, sc[j]);
    }
    double sum = s.sinks ? std::exp(s.sinks[h] - max) : 0.0;
    for (int64_t j = j0; j < n_vis; ++j) {
      sc[j] = std::exp(sc[j] - max);
      sum += sc[j];
    }
    const float inv = static_cast<float>(1.0 / sum);
    float* o = out + i * s.n_head * s.head_dim_v + h * s.head_dim_v;
    std::fill(o, o + s.head_dim_v, 0.0f);
    for (int64_t j = j0; j < n_vis; ++j) {
      const float p = sc[j] * inv;
      const float* vj = V + (j - lo) * v_stride + hk * s.head_dim_v;
      for (int64_t d = 0; d < s.head_dim_v; ++d) o[d] += p * vj[d];
    }
    // A rotated V cache gives H·out; H is its own inverse.
    if (v_rot > 0) cpu::hadamard_blocks(o, s.head_dim_v, v_rot);
  });
}

}  // namespace moe::model
