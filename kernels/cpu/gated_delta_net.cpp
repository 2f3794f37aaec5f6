#include "kernels/cpu/gated_delta_net.h"

#include <algorithm>
#include <cmath>

namespace moe::model {
namespace {

// Eight independent partial sums let the compiler vectorize without reassociating floats.
constexpr int kLanes = 8;

float sum_lanes(const float* acc) {
  float s = 0;
  for (int j = 0; j < kLanes; ++j) s += acc[j];
  return s;
}

// dst = src * decay (src null: zeros); returns dst · k.
float decay_dot(const float* src, float decay, const float* k, float* dst, int64_t n) {
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
float update_dot(float* s, float d, const float* k, const float* q, int64_t n) {
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

}  // namespace

void gated_delta_net(const GatedDeltaNetShape& s, const float* q, const float* k, const float* v,
                     int64_t stride, const float* g, const float* beta, int64_t n_tokens,
                     const float* state_in, float* state_out, float* out, cpu::ThreadPool& pool) {
  const int64_t NV = s.n_v_heads, NK = s.n_k_heads, DK = s.head_k, DV = s.head_v;
  const float scale = 1.0f / std::sqrt(static_cast<float>(DK));
  // Enough tasks to keep every thread busy at decode (one token, few heads), but blocks of at
  // least 16 rows so the per-task overhead stays small.
  const int64_t want = (2 * pool.size() + NV - 1) / NV;
  const int64_t splits = std::clamp<int64_t>(want, 1, std::max<int64_t>(1, DV / 16));
  const int64_t rows = (DV + splits - 1) / splits;
  const int64_t per_head = (DV + rows - 1) / rows;
  pool.parallel_for(NV * per_head, [&](int64_t task, int) {
    const int64_t h = task / per_head, kh = h % NK;
    const int64_t r0 = (task % per_head) * rows, r1 = std::min(DV, r0 + rows);
    const size_t head_off = static_cast<size_t>(h * DV * DK);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* qt = q + t * stride + kh * DK;
      const float* kt = k + t * stride + kh * DK;
      const float* vt = v + t * stride + h * DV;
      const float decay = std::exp(g[t * NV + h]);
      const float b = beta[t * NV + h];
      // The first token reads the committed state, later ones continue in state_out.
      const float* src = t == 0 ? (state_in ? state_in + head_off : nullptr) : state_out + head_off;
      float* o = out + t * NV * DV + h * DV;
      for (int64_t r = r0; r < r1; ++r) {
        float* sr = state_out + head_off + r * DK;
        const float u = decay_dot(src ? src + r * DK : nullptr, decay, kt, sr, DK);
        const float d = (vt[r] - u) * b;
        o[r] = update_dot(sr, d, kt, qt, DK) * scale;
      }
    }
  });
}

}  // namespace moe::model
