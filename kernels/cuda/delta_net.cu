// The gated DeltaNet kernels: causal conv1d (one thread per output value), L2 norm of heads (one
// warp per head) and the delta rule recurrence (a warp per two state rows, held in registers over
// the whole batch).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/delta_net.h"
#include "kernels/cuda/launch_util.cuh"

namespace moe::cuda {
namespace {

constexpr unsigned kFullMask = 0xFFFFFFFFu;

// ---- causal conv1d ------------------------------------------------------------------------------

// Items [0, n_tokens * C) are outputs, [n_tokens * C, (n_tokens + H) * C) the new window. Adjacent
// threads take adjacent channels, so every tap's read of a row is coalesced; the rows a token
// shares with its neighbours come from L1/L2.
__global__ void causal_conv_kernel(const float* x, int64_t n_tokens, const float* __restrict__ w,
                                   const float* state_in, float* state_out, float* out, int64_t C,
                                   int64_t K, bool silu) {
  const int64_t H = K - 1, n_out = n_tokens * C, total = n_out + H * C;
  for (int64_t i = grid_index(); i < total; i += grid_stride()) {
    if (i < n_out) {
      const int64_t t = i / C, c = i % C;
      float o = 0.0f;
      for (int64_t tap = 0; tap < K; ++tap) {
        const int64_t j = t - H + tap;  // row of [window, batch]; < 0 reads the window
        float in;
        if (j >= 0) {
          in = x[j * C + c];
        } else if (state_in) {
          in = state_in[(H + j) * C + c];
        } else {
          continue;  // the CPU skips zero rows; adding +0 could flip the sign of a -0 sum
        }
        // Rounded separately (no FMA), as the CPU's `o += in * w`.
        o = __fadd_rn(o, __fmul_rn(in, w[tap * C + c]));
      }
      if (silu) o = o / (1.0f + expf(-o));
      out[i] = o;
    } else {
      const int64_t r = (i - n_out) / C, c = (i - n_out) % C;
      const int64_t j = n_tokens - H + r;
      float v = 0.0f;
      if (j >= 0) {
        v = x[j * C + c];
      } else if (state_in) {
        v = state_in[(H + j) * C + c];
      }
      state_out[r * C + c] = v;
    }
  }
}

// ---- L2 norm of heads ---------------------------------------------------------------------------

constexpr int kNormWarps = 8;

__global__ void __launch_bounds__(kNormWarps * 32)
    l2norm_heads_kernel(float* x, int64_t n_rows, int64_t row_stride, int64_t n_heads,
                        int64_t head_dim, float eps) {
  const int lane = threadIdx.x % 32;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kNormWarps + threadIdx.x / 32;
  // The row index is uniform across a warp, so every lane reaches the shuffles.
  for (int64_t row = first; row < n_rows; row += static_cast<int64_t>(gridDim.x) * kNormWarps) {
    float* xr = x + (row / n_heads) * row_stride + (row % n_heads) * head_dim;
    double sum = 0;
    for (int64_t i = lane; i < head_dim; i += 32) {
      const float v = xr[i];
      sum += static_cast<double>(__fmul_rn(v, v));  // product in float, sum in double: as ggml
    }
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(kFullMask, sum, m);
    const float norm = sqrtf(static_cast<float>(sum));
    const float scale = 1.0f / (norm < eps ? eps : norm);  // std::max(norm, eps)
    for (int64_t i = lane; i < head_dim; i += 32) xr[i] *= scale;
  }
}

// ---- gated delta rule ---------------------------------------------------------------------------

constexpr int kDnWarps = 8;
constexpr int kDnRowsPerWarp = 2;  // two independent rows give the warp reductions some ILP
constexpr int kDnRows = kDnWarps * kDnRowsPerWarp;  // state rows per block
constexpr int kDnChunk = 16;                        // tokens staged in shared memory per pass

// Shared memory of the kernel for J floats of a key row per lane.
size_t delta_net_smem(int J) {
  return sizeof(float) *
         static_cast<size_t>(2 * kDnChunk * 32 * J + 2 * kDnChunk * kDnRows + 2 * kDnChunk);
}

// Sums R values over the warp; every lane gets the sums.
template <int R>
__device__ __forceinline__ void warp_sum(float (&x)[R]) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) {
#pragma unroll
    for (int r = 0; r < R; ++r) x[r] += __shfl_xor_sync(kFullMask, x[r], m);
  }
}

// Block (head h, rows r0..r0+kDnRows): warp w owns rows r0 + 2w and r0 + 2w + 1; lane l holds
// columns l + 32j (j < J) of both, zero past head_k (the staged k and q are zero-padded too, so
// the padding stays zero and adds nothing). The state is read once before the first token and
// written once after the last. Per pass, the block stages kDnChunk tokens' k and q of key head
// h % n_k_heads, its rows of v, exp(g) and beta; outputs are gathered in shared memory and
// written out row-contiguously.
template <int J>
__global__ void __launch_bounds__(kDnWarps * 32)
    gated_delta_net_kernel(const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, int64_t stride, const float* __restrict__ g,
                           const float* __restrict__ beta, int64_t n_tokens,
                           const float* __restrict__ state_in, float* __restrict__ state_out,
                           float* __restrict__ out, int n_k_heads, int n_v_heads, int head_k,
                           int head_v, int blocks_per_head, float scale) {
  constexpr int kPad = 32 * J;
  extern __shared__ float smem[];
  float* k_s = smem;                          // [kDnChunk][kPad]
  float* q_s = k_s + kDnChunk * kPad;         // [kDnChunk][kPad]
  float* v_s = q_s + kDnChunk * kPad;         // [kDnChunk][kDnRows]
  float* o_s = v_s + kDnChunk * kDnRows;      // [kDnChunk][kDnRows]
  float* decay_s = o_s + kDnChunk * kDnRows;  // [kDnChunk]
  float* beta_s = decay_s + kDnChunk;         // [kDnChunk]

  const int h = static_cast<int>(blockIdx.x) / blocks_per_head;
  const int kh = h % n_k_heads;
  const int r0 = (static_cast<int>(blockIdx.x) % blocks_per_head) * kDnRows;
  const int n_rows = min(kDnRows, head_v - r0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row_width = static_cast<int64_t>(n_v_heads) * head_v;  // of out

  if (head_k < kPad) {  // zero padding, never overwritten by the staging
    for (int i = threadIdx.x; i < 2 * kDnChunk * kPad; i += blockDim.x) smem[i] = 0.0f;
  }

  float st[kDnRowsPerWarp][J];
#pragma unroll
  for (int rr = 0; rr < kDnRowsPerWarp; ++rr) {
    const int lr = warp * kDnRowsPerWarp + rr;
    const float* src = state_in && lr < n_rows
                           ? state_in + (static_cast<int64_t>(h) * head_v + r0 + lr) * head_k
                           : nullptr;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      st[rr][j] = src && c < head_k ? src[c] : 0.0f;
    }
  }

  for (int64_t t0 = 0; t0 < n_tokens; t0 += kDnChunk) {
    const int nt = n_tokens - t0 < kDnChunk ? static_cast<int>(n_tokens - t0) : kDnChunk;
    __syncthreads();  // the previous pass has finished with the staging buffers
    for (int i = threadIdx.x; i < nt * head_k; i += blockDim.x) {
      const int tc = i / head_k, c = i % head_k;
      const int64_t off = (t0 + tc) * stride + static_cast<int64_t>(kh) * head_k + c;
      k_s[tc * kPad + c] = k[off];
      q_s[tc * kPad + c] = q[off];
    }
    for (int i = threadIdx.x; i < nt * n_rows; i += blockDim.x) {
      const int tc = i / n_rows, r = i % n_rows;
      v_s[tc * kDnRows + r] = v[(t0 + tc) * stride + static_cast<int64_t>(h) * head_v + r0 + r];
    }
    for (int i = threadIdx.x; i < nt; i += blockDim.x) {
      const int64_t gi = (t0 + i) * n_v_heads + h;
      decay_s[i] = expf(g[gi]);
      beta_s[i] = beta[gi];
    }
    __syncthreads();

    for (int tc = 0; tc < nt; ++tc) {
      float kk[J], qq[J];
#pragma unroll
      for (int j = 0; j < J; ++j) {
        kk[j] = k_s[tc * kPad + lane + 32 * j];
        qq[j] = q_s[tc * kPad + lane + 32 * j];
      }
      const float decay = decay_s[tc], b = beta_s[tc];
      float u[kDnRowsPerWarp];
#pragma unroll
      for (int rr = 0; rr < kDnRowsPerWarp; ++rr) {
        u[rr] = 0.0f;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          st[rr][j] = __fmul_rn(st[rr][j], decay);  // rounded as the CPU's decayed copy
          u[rr] = fmaf(st[rr][j], kk[j], u[rr]);
        }
      }
      warp_sum(u);
      float o[kDnRowsPerWarp];
#pragma unroll
      for (int rr = 0; rr < kDnRowsPerWarp; ++rr) {
        const int lr = warp * kDnRowsPerWarp + rr;
        const float vr = lr < n_rows ? v_s[tc * kDnRows + lr] : 0.0f;
        const float d = (vr - u[rr]) * b;
        o[rr] = 0.0f;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          st[rr][j] = __fadd_rn(st[rr][j], __fmul_rn(d, kk[j]));  // the CPU's `s += d * k`
          o[rr] = fmaf(st[rr][j], qq[j], o[rr]);
        }
      }
      warp_sum(o);
      if (lane == 0) {
#pragma unroll
        for (int rr = 0; rr < kDnRowsPerWarp; ++rr) {
          o_s[tc * kDnRows + warp * kDnRowsPerWarp + rr] = o[rr] * scale;
        }
      }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nt * n_rows; i += blockDim.x) {
      const int tc = i / n_rows, r = i % n_rows;
      out[(t0 + tc) * row_width + static_cast<int64_t>(h) * head_v + r0 + r] =
          o_s[tc * kDnRows + r];
    }
  }

#pragma unroll
  for (int rr = 0; rr < kDnRowsPerWarp; ++rr) {
    const int lr = warp * kDnRowsPerWarp + rr;
    if (lr >= n_rows) continue;
    float* dst = state_out + (static_cast<int64_t>(h) * head_v + r0 + lr) * head_k;
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int c = lane + 32 * j;
      if (c < head_k) dst[c] = st[rr][j];
    }
  }
}

template <int J>
void launch_gated_delta_net(unsigned blocks, cudaStream_t stream, const float* q, const float* k,
                            const float* v, int64_t stride, const float* g, const float* beta,
                            int64_t n_tokens, const float* state_in, float* state_out, float* out,
                            int n_k_heads, int n_v_heads, int head_k, int head_v,
                            int blocks_per_head, float scale) {
  gated_delta_net_kernel<J><<<blocks, kDnWarps * 32, delta_net_smem(J), stream>>>(
      q, k, v, stride, g, beta, n_tokens, state_in, state_out, out, n_k_heads, n_v_heads, head_k,
      head_v, blocks_per_head, scale);
}

// ---- argument checks ----------------------------------------------------------------------------

constexpr int64_t kMaxInt = 0x7FFFFFFF;

// Whether the float ranges [a, a + na) and [b, b + nb) share memory (null or empty: no).
bool overlap(const float* a, int64_t na, const float* b, int64_t nb) {
  if (!a || !b || na <= 0 || nb <= 0) return false;
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(nb) * sizeof(float) &&
         b0 < a0 + static_cast<uintptr_t>(na) * sizeof(float);
}

struct Range {
  const float* p;
  int64_t n;
  const char* name;
};

// Throws when the written range overlaps any of `others`.
void check_no_overlap(const char* fn, const Range& written, std::initializer_list<Range> others) {
  for (const Range& o : others) {
    if (overlap(written.p, written.n, o.p, o.n)) {
      throw Error(std::string(fn) + ": " + written.name + " overlaps " + o.name);
    }
  }
}

}  // namespace

void causal_conv1d(const CausalConvDims& s, const float* x, int64_t n_tokens,
                   const float* w_tap_major, const float* state_in, float* state_out, float* out,
                   bool silu, cudaStream_t stream) {
  const int64_t C = s.channels, K = s.kernel;
  if (C < 1 || K < 1 || n_tokens < 0 || C > kMaxInt || K > 4096) {
    throw Error("causal_conv1d: invalid shape (channels " + std::to_string(C) + ", kernel " +
                std::to_string(K) + ", n_tokens " + std::to_string(n_tokens) + ")");
  }
  const int64_t H = K - 1;
  if (n_tokens == 0 && H == 0) return;
  if (!w_tap_major || (n_tokens > 0 && (!x || !out)) || (H > 0 && !state_out)) {
    throw Error("causal_conv1d: null device pointer");
  }
  const Range xr{x, n_tokens * C, "x"}, sin{state_in, H * C, "state_in"};
  const Range sout{state_out, H * C, "state_out"}, outr{out, n_tokens * C, "out"};
  check_no_overlap("causal_conv1d", outr, {xr, sin, sout});
  check_no_overlap("causal_conv1d", sout, {xr, sin});
  const int64_t total = (n_tokens + H) * C;
  causal_conv_kernel<<<elem_blocks(total), kElemThreads, 0, stream>>>(
      x, n_tokens, w_tap_major, state_in, state_out, out, C, K, silu);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void l2norm_heads(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                  float eps, cudaStream_t stream) {
  if (n_tokens < 0 || n_heads < 1 || head_dim < 1) {
    throw Error("l2norm_heads: invalid shape (n_tokens " + std::to_string(n_tokens) + ", n_heads " +
                std::to_string(n_heads) + ", head_dim " + std::to_string(head_dim) + ")");
  }
  if (row_stride < n_heads * head_dim) {
    throw Error("l2norm_heads: row_stride " + std::to_string(row_stride) +
                " < n_heads * head_dim " + std::to_string(n_heads * head_dim));
  }
  if (n_tokens == 0) return;
  if (!x) throw Error("l2norm_heads: null device pointer");
  const int64_t n_rows = n_tokens * n_heads;
  const int64_t blocks = std::min<int64_t>((n_rows + kNormWarps - 1) / kNormWarps, 1 << 16);
  l2norm_heads_kernel<<<static_cast<unsigned>(blocks), kNormWarps * 32, 0, stream>>>(
      x, n_rows, row_stride, n_heads, head_dim, eps);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void gated_delta_net(const DeltaNetDims& s, const float* q, const float* k, const float* v,
                     int64_t stride, const float* g, const float* beta, int64_t n_tokens,
                     const float* state_in, float* state_out, float* out, cudaStream_t stream) {
  const int64_t NK = s.n_k_heads, NV = s.n_v_heads, DK = s.head_k, DV = s.head_v;
  if (NK < 1 || NV < 1 || DK < 1 || DV < 1 || n_tokens < 0 || NV > kMaxInt || DV > kMaxInt ||
      NV * DV > kMaxInt || NK > kMaxInt) {
    throw Error("gated_delta_net: invalid shape (n_k_heads " + std::to_string(NK) + ", n_v_heads " +
                std::to_string(NV) + ", head_k " + std::to_string(DK) + ", head_v " +
                std::to_string(DV) + ", n_tokens " + std::to_string(n_tokens) + ")");
  }
  if (NV % NK != 0) {
    throw Error("gated_delta_net: n_v_heads " + std::to_string(NV) +
                " is not a multiple of n_k_heads " + std::to_string(NK));
  }
  if (DK > 256) {
    throw Error("gated_delta_net: head_k " + std::to_string(DK) + " > 256 is not supported");
  }
  if (stride < NK * DK || stride < NV * DV) {
    throw Error("gated_delta_net: stride " + std::to_string(stride) +
                " < max(n_k_heads * head_k, n_v_heads * head_v)");
  }
  if (n_tokens == 0) return;
  if (!q || !k || !v || !g || !beta || !state_out || !out) {
    throw Error("gated_delta_net: null device pointer");
  }
  const int64_t state_n = NV * DV * DK, last = (n_tokens - 1) * stride;
  const Range qr{q, last + NK * DK, "q"}, kr{k, last + NK * DK, "k"}, vr{v, last + NV * DV, "v"};
  const Range gr{g, n_tokens * NV, "g"}, br{beta, n_tokens * NV, "beta"};
  const Range sin{state_in, state_n, "state_in"}, sout{state_out, state_n, "state_out"};
  const Range outr{out, n_tokens * NV * DV, "out"};
  check_no_overlap("gated_delta_net", sout, {qr, kr, vr, gr, br, sin, outr});
  check_no_overlap("gated_delta_net", outr, {qr, kr, vr, gr, br, sin});

  const int64_t blocks_per_head = (DV + kDnRows - 1) / kDnRows;
  const int64_t blocks = NV * blocks_per_head;
  const float scale = 1.0f / std::sqrt(static_cast<float>(DK));  // as the CPU, on the host
  // One instantiation per register footprint: J = ceil(head_k / 32) floats of a row per lane.
  using Launcher = decltype(&launch_gated_delta_net<1>);
  static constexpr Launcher kLaunchers[8] = {
      &launch_gated_delta_net<1>, &launch_gated_delta_net<2>, &launch_gated_delta_net<3>,
      &launch_gated_delta_net<4>, &launch_gated_delta_net<5>, &launch_gated_delta_net<6>,
      &launch_gated_delta_net<7>, &launch_gated_delta_net<8>};
  kLaunchers[(DK + 31) / 32 - 1](static_cast<unsigned>(blocks), stream, q, k, v, stride, g, beta,
                                 n_tokens, state_in, state_out, out, static_cast<int>(NK),
                                 static_cast<int>(NV), static_cast<int>(DK), static_cast<int>(DV),
                                 static_cast<int>(blocks_per_head), scale);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
