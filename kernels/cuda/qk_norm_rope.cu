// One block per (token, head): the block builds the token's cos/sin table (as rope.cu), normalises
// its head (as rmsnorm.cu: the same thread count, so the same double sums), then rotates it.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/qk_norm_rope.h"
#include "kernels/cuda/rms_scale.cuh"

namespace moe::cuda {
namespace {

constexpr int kThreads = 128;  // rmsnorm.cu's: keeps the double sums in the same order

// model::RopeYarn as the kernel takes it (on = false: today's plain angles); span is rope.cpp's
// max(0.001, corr_high - corr_low), computed once on the host.
struct YarnArgs {
  bool on;
  float freq_scale, ext_factor, mscale, corr_low, span;
};

// Grid: x = token, y = q heads, then k heads, then (with a store) v heads.
__global__ void __launch_bounds__(kThreads)
    qk_norm_rope_kernel(QkHeads q, QkHeads k, int64_t head_dim, float eps, int64_t n_half,
                        int64_t pos0_host, const int32_t* device_pos0, float theta_scale,
                        QkKvStoreF16 store, YarnArgs yarn) {
  extern __shared__ float smem[];
  float* cs = smem;              // cos, sin of pair i at 2i, 2i+1
  float* y = smem + 2 * n_half;  // the normalised head
  __shared__ double partial[kThreads / 32];
  __shared__ float scale_s;
  const int64_t t = blockIdx.x;
  // A device position (CUDA graphs) is read when the kernel runs; one that would put the batch
  // outside the cache writes no cache row (the host checked its own).
  const int64_t pos0 = device_pos0 ? *device_pos0 : pos0_host;
  const bool store_ok = store.k_cache && pos0 >= 0 && pos0 + gridDim.x <= store.n_ctx;
  if (static_cast<int64_t>(blockIdx.y) >= q.n_head + k.n_head) {  // a v head: stored as is
    const int64_t h = blockIdx.y - q.n_head - k.n_head;
    if (!store_ok) return;
    const float* src = store.v + t * store.v_stride + h * store.head_dim_v;
    auto* dst = reinterpret_cast<__half*>(static_cast<uint8_t*>(store.v_cache) +
                                          (pos0 + t) * static_cast<int64_t>(store.v_row_bytes)) +
                h * store.head_dim_v;
    for (int64_t i = threadIdx.x; i < store.head_dim_v; i += kThreads) {
      dst[i] = __float2half_rn(src[i]);
    }
    return;
  }
  const bool is_q = static_cast<int64_t>(blockIdx.y) < q.n_head;
  const QkHeads& s = is_q ? q : k;
  const int64_t h = is_q ? blockIdx.y : blockIdx.y - q.n_head;
  float* v = s.x + t * s.row_stride + h * head_dim;
  __half* kc = nullptr;  // this k head in the cache row, when stored
  if (!is_q && store_ok) {
    kc = reinterpret_cast<__half*>(static_cast<uint8_t*>(store.k_cache) +
                                   (pos0 + t) * static_cast<int64_t>(store.k_row_bytes)) +
         h * head_dim;
  }

  const float pos = static_cast<float>(pos0 + t);
  for (int64_t i = threadIdx.x; i < n_half; i += kThreads) {
    float theta = pos;
    for (int64_t j = 0; j < i; ++j) theta = __fmul_rn(theta, theta_scale);
    if (!yarn.on) {
      cs[2 * i] = cosf(theta);
      cs[2 * i + 1] = sinf(theta);
      continue;
    }
    // rope_angles_yarn's steps, each rounded on its own as the CPU computes them (no FMA).
    const float theta_interp = __fmul_rn(yarn.freq_scale, theta);
    float th = theta_interp;
    if (yarn.ext_factor != 0.0f) {
      const float r = __fdiv_rn(__fsub_rn(static_cast<float>(i), yarn.corr_low), yarn.span);
      const float ramp = __fsub_rn(1.0f, fminf(1.0f, fmaxf(0.0f, r)));
      const float mix = __fmul_rn(ramp, yarn.ext_factor);
      th = __fadd_rn(__fmul_rn(theta_interp, __fsub_rn(1.0f, mix)), __fmul_rn(theta, mix));
    }
    cs[2 * i] = __fmul_rn(cosf(th), yarn.mscale);
    cs[2 * i + 1] = __fmul_rn(sinf(th), yarn.mscale);
  }
  if (s.norm) {
    double sum = 0;
    for (int64_t i = threadIdx.x; i < head_dim; i += kThreads) {
      const double d = v[i];
      sum += d * d;
    }
    detail::rms_scale<kThreads>(sum, partial, &scale_s, head_dim, eps);
    const float scale = scale_s;
    for (int64_t i = threadIdx.x; i < head_dim; i += kThreads) y[i] = v[i] * scale * s.norm[i];
  } else {
    for (int64_t i = threadIdx.x; i < head_dim; i += kThreads) y[i] = v[i];  // RoPE only
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < head_dim; i += kThreads) {
    if (i < n_half) {
      const float c = cs[2 * i], sn = cs[2 * i + 1];
      const float x0 = y[i], x1 = y[i + n_half];
      // Each product rounded on its own, as the CPU computes it (no FMA).
      const float r0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, sn));
      const float r1 = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, c));
      v[i] = r0;
      v[i + n_half] = r1;
      if (kc) {
        kc[i] = __float2half_rn(r0);
        kc[i + n_half] = __float2half_rn(r1);
      }
    } else if (i >= 2 * n_half) {
      v[i] = y[i];
      if (kc) kc[i] = __float2half_rn(y[i]);
    }
  }
}

void check_heads(const QkHeads& s, int64_t head_dim, const char* which) {
  if (!s.x) throw Error(std::string("qk_norm_rope: null ") + which + " pointer");
  if (s.n_head < 1 || s.row_stride < s.n_head * head_dim) {
    throw Error(std::string("qk_norm_rope: ") + which + " has " + std::to_string(s.n_head) +
                " heads of " + std::to_string(head_dim) + " in rows of " +
                std::to_string(s.row_stride));
  }
}

}  // namespace

void qk_norm_rope(const QkHeads& q, const QkHeads& k, int64_t n_tokens, int64_t head_dim, float eps,
                  int64_t n_rot, int64_t pos0, float freq_base, cudaStream_t stream,
                  const int32_t* device_pos0, const QkKvStoreF16* store,
                  const model::RopeYarn* yarn) {
  if (n_tokens < 0 || head_dim < 1 || head_dim > 4096 || pos0 < 0 || n_tokens > 0x7FFFFFFF) {
    throw Error("qk_norm_rope: invalid shape (n_tokens " + std::to_string(n_tokens) +
                ", head_dim " + std::to_string(head_dim) + ", pos0 " + std::to_string(pos0) + ")");
  }
  if (n_rot < 2 || n_rot % 2 != 0 || n_rot > head_dim) {
    throw Error("qk_norm_rope: n_rot " + std::to_string(n_rot) + " must be even, in [2, head_dim " +
                std::to_string(head_dim) + "]");
  }
  if (n_tokens == 0) return;
  check_heads(q, head_dim, "q");
  check_heads(k, head_dim, "k");
  QkKvStoreF16 st{};
  if (store) {
    st = *store;
    if (!st.k_cache || !st.v_cache || !st.v) throw Error("qk_norm_rope: null cache pointer");
    if (pos0 + n_tokens > st.n_ctx) {
      throw Error("qk_norm_rope: context length " + std::to_string(st.n_ctx) +
                  " exceeded (positions " + std::to_string(pos0) + " .. " +
                  std::to_string(pos0 + n_tokens - 1) + ")");
    }
    if (st.head_dim_v < 1 || st.v_stride < k.n_head * st.head_dim_v ||
        st.k_row_bytes < static_cast<size_t>(2 * k.n_head * head_dim) ||
        st.v_row_bytes < static_cast<size_t>(2 * k.n_head * st.head_dim_v) ||
        st.k_row_bytes % 2 != 0 || st.v_row_bytes % 2 != 0) {
      throw Error("qk_norm_rope: cache rows do not hold the k/v heads");
    }
  }
  const int64_t n_blocks_y = q.n_head + k.n_head * (store ? 2 : 1);
  if (n_blocks_y > 65535) throw Error("qk_norm_rope: too many heads");
  // The scale on the host with the same call as rope.cpp, so the angles match the CPU's.
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(n_rot));
  const int64_t n_half = n_rot / 2;
  YarnArgs ya{};
  if (yarn) {
    ya = {true,         yarn->freq_scale, yarn->ext_factor,
          yarn->mscale, yarn->corr_low,   std::max(0.001f, yarn->corr_high - yarn->corr_low)};
  }
  const size_t smem = static_cast<size_t>(n_rot + head_dim) * sizeof(float);
  const dim3 grid(static_cast<unsigned>(n_tokens), static_cast<unsigned>(n_blocks_y));
  qk_norm_rope_kernel<<<grid, kThreads, smem, stream>>>(q, k, head_dim, eps, n_half, pos0,
                                                        device_pos0, theta_scale, st, ya);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
