#include "kernels/cpu/gated_delta_net.h"

#include <algorithm>
#include <cmath>

namespace moe::model {
namespace {

// Eight independent partial sums let the compiler vectorize without reassociating floats.
constexpr int kLanes = 8;

[[gnu::always_inline]] inline float sum_lanes(const float* acc) {
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// dst = src * decay (src null: zeros); returns dst · k.
[[gnu::always_inline]] inline float decay_dot(const float* src, float decay, const float* k,
                                              float* dst, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  if (!src) {
    std::fill(dst, dst + n, 0.0f);
    return 0.0f;
  }
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const float x = src[i + j] * decay;
      dst[i + j] = x;
      acc[j] += x * k[i + j];
    }
  }
  float tail = 0;
  for (; i < n; ++i) {
    dst[i] = src[i] * decay;
    tail += dst[i] * k[i];
  }
  return sum_lanes(acc) + tail;
}

// s += d * k; returns s · q.
[[gnu::always_inline]] inline float update_dot(float* s, float d, const float* k, const float* q,
                                               int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      s[i + j] += d * k[i + j];
      acc[j] += s[i + j] * q[i + j];
    }
  }
  float tail = 0;
  for (; i < n; ++i) {
    s[i] += d * k[i];
    tail += s[i] * q[i];
  }
  return sum_lanes(acc) + tail;
}

// One row of one token in the scalar order: s = decay * src (src null: zeros), d = beta (v - s.k),
// s += d k; returns (s.q) scale.
[[gnu::always_inline]] inline float step_row(const float* src, float* s, float decay, float b,
                                             float v, const float* k, const float* q, int64_t n,
                                             float scale) {
  const float u = decay_dot(src, decay, k, s, n);
  return update_dot(s, (v - u) * b, k, q, n) * scale;
}

// Decode (one token): the state streams from memory once, so it is bandwidth-bound and stays on
// the baseline ISA, row by row (with the AVX2 clone it took 2.34-2.38 ms per qwen3.6 token at 16
// threads on the H200 host in two calls, against 1.66 before; not measured in one call).
void decode_rows(const GatedDeltaNetShape& s, const float* q, const float* k, const float* v,
                 const float* g, const float* beta, const float* state_in, float* state_out,
                 float* out, int64_t h, int64_t r0, int64_t r1) {
  const int64_t DK = s.head_k, DV = s.head_v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(DK));
  const int64_t kh = h % s.n_k_heads;
  const size_t head_off = static_cast<size_t>(h * DV * DK);
  const float decay = std::exp(g[h]), b = beta[h];
  const float* src = state_in ? state_in + head_off : nullptr;
  for (int64_t r = r0; r < r1; ++r) {
    out[h * DV + r] = step_row(src ? src + r * DK : nullptr, state_out + head_off + r * DK, decay,
                               b, v[h * DV + r], k + kh * DK, q + kh * DK, DK, scale);
  }
}

// Eight floats as one value (GCC/Clang vector extension: one AVX register, two at the baseline
// ISA); lane l holds the partial sum acc[l] of the scalar loops above.
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

// Rows are read and written through memcpy (unaligned); no Lanes crosses a call, as its ABI differs
// between the clones.
float sum_lanes(const Lanes& v) {
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += v[j];
  return s;
}

// Rows [r0, r1) of value head h over every token: the block stays in cache from token to token.
// kRows rows at a time: a row's dot products are each a dependency chain, so interleaving
// independent rows keeps the vector units busy; each row still adds its terms in the order of
// decay_dot / update_dot. Cloned for AVX2 with FMA (contracted products round once, within the
// test's bound): 2.9x on one core for a 64-token batch of qwen3.6's heads, where the
// recurrence was 13% of a CPU pp64 on the H200 host.
constexpr int64_t kRows = 4;

__attribute__((target_clones("avx2,fma", "default"))) void recur_rows(
    const GatedDeltaNetShape& s, const float* q, const float* k, const float* v, int64_t stride,
    const float* g, const float* beta, int64_t n_tokens, const float* state_in, float* state_out,
    float* out, int64_t h, int64_t r0, int64_t r1) {
  const int64_t NV = s.n_v_heads, NK = s.n_k_heads, DK = s.head_k, DV = s.head_v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(DK));
  const int64_t kh = h % NK;
  const size_t head_off = static_cast<size_t>(h * DV * DK);
  const bool blocked = DK % kLanes == 0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* qt = q + t * stride + kh * DK;
    const float* kt = k + t * stride + kh * DK;
    const float* vt = v + t * stride + h * DV;
    const float decay = std::exp(g[t * NV + h]);
    const float b = beta[t * NV + h];
    // The first token reads the committed state, later ones continue in state_out.
    const float* src = t == 0 ? (state_in ? state_in + head_off : nullptr) : state_out + head_off;
    float* o = out + t * NV * DV + h * DV;
    int64_t r = r0;
    for (; blocked && src && r + kRows <= r1; r += kRows) {
      float* sr = state_out + head_off + r * DK;
      const float* sp = src + r * DK;
      Lanes acc[kRows] = {};
      for (int64_t i = 0; i < DK; i += kLanes) {
        Lanes kv, x;
        __builtin_memcpy(&kv, kt + i, sizeof kv);
        for (int64_t j = 0; j < kRows; ++j) {
          __builtin_memcpy(&x, sp + j * DK + i, sizeof x);
          x *= decay;
          __builtin_memcpy(sr + j * DK + i, &x, sizeof x);
          acc[j] += x * kv;
        }
      }
      float d[kRows];
      for (int64_t j = 0; j < kRows; ++j) {
        d[j] = (vt[r + j] - sum_lanes(acc[j])) * b;
        acc[j] = Lanes{};
      }
      for (int64_t i = 0; i < DK; i += kLanes) {
        Lanes kv, qv, x;
        __builtin_memcpy(&kv, kt + i, sizeof kv);
        __builtin_memcpy(&qv, qt + i, sizeof qv);
        for (int64_t j = 0; j < kRows; ++j) {
          __builtin_memcpy(&x, sr + j * DK + i, sizeof x);
          x += d[j] * kv;
          __builtin_memcpy(sr + j * DK + i, &x, sizeof x);
          acc[j] += x * qv;
        }
      }
      for (int64_t j = 0; j < kRows; ++j) o[r + j] = sum_lanes(acc[j]) * scale;
    }
    for (; r < r1; ++r) {
      o[r] = step_row(src ? src + r * DK : nullptr, state_out + head_off + r * DK, decay, b, vt[r],
                      kt, qt, DK, scale);
    }
  }
}

}  // namespace

void gated_delta_net(const GatedDeltaNetShape& s, const float* q, const float* k, const float* v,
                     int64_t stride, const float* g, const float* beta, int64_t n_tokens,
                     const float* state_in, float* state_out, float* out, cpu::ThreadPool& pool) {
  const int64_t NV = s.n_v_heads, DV = s.head_v;
  // Enough tasks to keep every thread busy at decode (one token, few heads), but blocks of at
  // least 16 rows so the per-task overhead stays small.
  const int64_t want = (2 * pool.size() + NV - 1) / NV;
  const int64_t splits = std::clamp<int64_t>(want, 1, std::max<int64_t>(1, DV / 16));
  const int64_t rows = (DV + splits - 1) / splits;
  const int64_t per_head = (DV + rows - 1) / rows;
  pool.parallel_for(NV * per_head, [&](int64_t task, int) {
    const int64_t h = task / per_head;
    const int64_t r0 = (task % per_head) * rows, r1 = std::min(DV, r0 + rows);
    if (n_tokens == 1) {
      decode_rows(s, q, k, v, g, beta, state_in, state_out, out, h, r0, r1);
    } else {
      recur_rows(s, q, k, v, stride, g, beta, n_tokens, state_in, state_out, out, h, r0, r1);
    }
  });
}

}  // namespace moe::model
