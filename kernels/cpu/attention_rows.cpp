#include "kernels/cpu/attention_rows.h"

#include <algorithm>
#include <cmath>

namespace moe::cpu {
namespace {

constexpr int64_t kTile = 64;  // positions per tile: its K and V rows stay in L1/L2 for all rows

// Sixteen independent partial sums: vectorizes at any width without reassociating.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int j = 0; j < 16; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = 0;
  for (; i < n; ++i) sum += a[i] * b[i];
  for (int j = 0; j < 16; ++j) sum += acc[j];
  return sum;
}

inline void scale_row(float* o, float c, int64_t n) {
  for (int64_t d = 0; d < n; ++d) o[d] *= c;
}

inline void axpy(float* o, float p, const float* v, int64_t n) {
  for (int64_t d = 0; d < n; ++d) o[d] += p * v[d];
}

}  // namespace

// Compiled three times (GCC function multiversioning); the helpers above are inlined into each.
__attribute__((target_clones("avx512f", "avx2,fma", "default"))) void attend_rows(
    const AttendRows& a, AttendRowsScratch& scratch) {
  const int64_t R = a.n_rows;
  if (R <= 0) return;
  int64_t n_end = 0, n_begin = INT64_MAX;
  for (int64_t r = 0; r < R; ++r) {
    n_end = std::max(n_end, a.n_vis[r]);
    n_begin = std::min(n_begin, a.first_vis ? a.first_vis[r] : 0);
  }
  if (scratch.scores.size() < static_cast<size_t>(R * kTile)) {
    scratch.scores.resize(static_cast<size_t>(R * kTile));
  }
  if (scratch.m.size() < static_cast<size_t>(R)) {
    scratch.m.resize(static_cast<size_t>(R));
    scratch.l.resize(static_cast<size_t>(R));
  }
  float* S = scratch.scores.data();
  float* m = scratch.m.data();
  float* l = scratch.l.data();
  std::fill(m, m + R, -INFINITY);
  std::fill(l, l + R, 0.0f);
  std::fill(a.out, a.out + R * a.hd_v, 0.0f);

  // Tiles start on a multiple of kTile below the earliest visible position (sliding windows).
  for (int64_t p0 = n_begin / kTile * kTile; p0 < n_end; p0 += kTile) {
    const int64_t pt = std::min(kTile, n_end - p0);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t vis = std::min(pt, a.n_vis[r] - p0);  // visible positions of this tile
      const int64_t j0 = a.first_vis ? std::max<int64_t>(0, a.first_vis[r] - p0) : 0;
      if (vis <= j0) continue;
      const float* q = a.q + r * a.hd_k;
      float* s = S + r * kTile;
      float mx = -INFINITY;
      for (int64_t j = j0; j < vis; ++j) {
        s[j] = dot(q, a.k + (p0 + j) * a.k_stride, a.hd_k) * a.scale;
        mx = std::max(mx, s[j]);
      }
      const float m_new = std::max(m[r], mx);
      const float corr = std::exp(m[r] - m_new);  // 0 on the row's first tile (m = -inf)
      float sum = 0;
      for (int64_t j = j0; j < vis; ++j) {
        s[j] = std::exp(s[j] - m_new);
        sum += s[j];
      }
      l[r] = l[r] * corr + sum;
      m[r] = m_new;
      float* o = a.out + r * a.hd_v;
      scale_row(o, corr, a.hd_v);
      for (int64_t j = j0; j < vis; ++j) axpy(o, s[j], a.v + (p0 + j) * a.v_stride, a.hd_v);
    }
  }
  for (int64_t r = 0; r < R; ++r) {
    float c = 1.0f / l[r];
    if (a.sinks) {
      // The sink joins the denominator: rescale to the common max, the output by the same.
      const float m_fin = std::max(m[r], a.sinks[r]);
      const float corr = std::exp(m[r] - m_fin);
      c = corr / (l[r] * corr + std::exp(a.sinks[r] - m_fin));
    }
    scale_row(a.out + r * a.hd_v, c, a.hd_v);
  }
}

void attend_rows_ref(const AttendRows& a) {
  for (int64_t r = 0; r < a.n_rows; ++r) {
    const float* q = a.q + r * a.hd_k;
    const int64_t p_first = a.first_vis ? a.first_vis[r] : 0;
    const int64_t n = a.n_vis[r] - p_first;
    const float* k = a.k + p_first * a.k_stride;
    const float* v = a.v + p_first * a.v_stride;
    std::vector<double> s(static_cast<size_t>(n));
    double mx = a.sinks ? static_cast<double>(a.sinks[r]) : -INFINITY;
    for (int64_t p = 0; p < n; ++p) {
      double d = 0;
      for (int64_t i = 0; i < a.hd_k; ++i) d += static_cast<double>(q[i]) * k[p * a.k_stride + i];
      s[static_cast<size_t>(p)] = d * a.scale;
      mx = std::max(mx, s[static_cast<size_t>(p)]);
    }
    double sum = a.sinks ? std::exp(a.sinks[r] - mx) : 0.0;
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int64_t d = 0; d < a.hd_v; ++d) {
      double o = 0;
      for (int64_t p = 0; p < n; ++p) o += s[static_cast<size_t>(p)] * v[p * a.v_stride + d];
      a.out[r * a.hd_v + d] = static_cast<float>(o / sum);
    }
  }
}

}  // namespace moe::cpu
