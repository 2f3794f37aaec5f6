// Internal: the weight-product kernels behind matmul() and grouped_matmul(), templated on the
// weight decoder: a GEMV for up to 8 activation rows per weight matrix (decode: memory-bound,
// every weight row read once) and a tiled kernel for larger batches (prefill: every dequantized
// weight tile reused for 64 rows). matmul_float.cu, matmul_blocks.cu and matmul_kquants.cu
// instantiate them for their types, so the three families compile in parallel.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/dequant_device.cuh"
#include "kernels/cuda/matmul.h"
#include "kernels/cuda/weight_product.h"

namespace moe::cuda::detail {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// What the kernels read; one struct so both kernels share the group/row mapping.
struct Args {
  int64_t n_in, n_out;
  size_t row_bytes;
  const uint8_t* w;
  const void* const* w_ptrs;
  const int32_t* offsets;
  int64_t n_rows;
  const int32_t* x_rows;
  const float* x;
  int64_t x_stride;
  float* y;
  bool x_vec4;  // x and x_stride allow float4 loads
};

// Rows [r0, r1) of output and the weight matrix of group g.
__device__ __forceinline__ const uint8_t* group_range(const Args& a, int g, int64_t& r0,
                                                      int64_t& r1) {
  if (a.offsets) {
    r0 = a.offsets[g];
    r1 = a.offsets[g + 1];
    return static_cast<const uint8_t*>(a.w_ptrs[g]);
  }
  r0 = 0;
  r1 = a.n_rows;
  return a.w;
}

// A group whose weight pointer is null (an expert that is not resident, say) gets NaN in its
// rows for outputs [o0, o0 + n_o) instead of a fault that would poison the whole context.
__device__ __forceinline__ void fill_nan(const Args& a, int64_t r0, int64_t r1, int64_t o0,
                                         int64_t n_o) {
  const int64_t n = min(n_o, a.n_out - o0);
  for (int64_t i = threadIdx.x; i < (r1 - r0) * n; i += blockDim.x) {
    a.y[(r0 + i / n) * a.n_out + o0 + i % n] = __int_as_float(0x7FC00000);
  }
}

__device__ __forceinline__ const float* x_row(const Args& a, int64_t j) {
  const int64_t src = a.x_rows ? static_cast<int64_t>(a.x_rows[j]) : j;
  return a.x + src * a.x_stride;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}

// The staged decode GEMVs' activation row: x (n floats) into shared memory xs by a block of
// kThreads threads, with kStride - kChunk floats of padding after every kChunk (against bank
// conflicts; kChunk a multiple of 4); float4 loads when vec4.
template <int kThreads, int kChunk, int kStride>
__device__ __forceinline__ void stage_padded_row(float* xs, const float* x, int64_t n, bool vec4) {
  const int tid = static_cast<int>(threadIdx.x);
  if (vec4) {
    for (int64_t i = tid; i < n / 4; i += kThreads) {
      *reinterpret_cast<float4*>(xs + i / (kChunk / 4) * kStride + i % (kChunk / 4) * 4) =
          __ldg(reinterpret_cast<const float4*>(x) + i);
    }
  } else {
    for (int64_t i = tid; i < n; i += kThreads)
      xs[i / kChunk * kStride + i % kChunk] = __ldg(x + i);
  }
}

// Sum over the SW lanes of each segment of a warp (xor shuffles stay inside it); every lane
// joins.
template <int SW>
__device__ __forceinline__ float segment_sum(float v) {
#pragma unroll
  for (int m = SW / 2; m > 0; m >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, m);
  return v;
}

// ---- GEMV: 4 output rows per block, the K dimension spread over the block's 128 threads ---------
//
// Each thread decodes one unit (8 weights) of each of the 4 rows per step and multiplies it with
// the matching 8 floats of every activation row: the activations, read from L1, are reused for 4
// weight rows (otherwise their 4 bytes per weight, against ~0.6 for Q4_K, would saturate L1 before
// DRAM), and 4 independent decodes per step keep enough weight bytes in flight. The decode is
// instruction-bound for 4-bit types, so a block's scale (and min) are applied once per unit to
// sum(q x) (and sum(x)) rather than per weight. Splitting K over 4 warps (reduced through shared
// memory in a fixed order) gives enough blocks for small matrices.

constexpr int kGemvThreads = 128;
constexpr int kGemvWarps = kGemvThreads / 32;
constexpr int kGemvRows = 4;  // output rows per block

// Output rows o0 .. o0+3 (rows past n_out repeat the last one and are not written) for
// activation rows j0 .. j0+R-1. red: kGemvRows * R * kGemvWarps floats of shared memory.
template <class Dec, int R>
__device__ __forceinline__ void gemv_pass(const Args& a, const uint8_t* __restrict__ w, int64_t o0,
                                          int64_t j0, float* red) {
  const int tid = static_cast<int>(threadIdx.x), lane = tid % 32, warp = tid / 32;
  const uint8_t* wrow[kGemvRows];
#pragma unroll
  for (int n = 0; n < kGemvRows; ++n) {
    const int64_t o = min(o0 + n, a.n_out - 1);
    wrow[n] = w + o * static_cast<int64_t>(a.row_bytes);
  }
  const float* xp[R];
#pragma unroll
  for (int r = 0; r < R; ++r) xp[r] = x_row(a, j0 + r);
  float acc[kGemvRows][R];
#pragma unroll
  for (int n = 0; n < kGemvRows; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) acc[n][r] = 0.0f;
  }
  const int64_t n_units = a.n_in / Dec::kPer;
  for (int64_t u = tid; u < n_units; u += kGemvThreads) {
    if constexpr (Dec::kPer == 8) {
      // Block types: the unit's scale (and min) are applied once to sum(q x) (and sum(x)).
      float q[kGemvRows][8], scale[kGemvRows], mn[kGemvRows];
#pragma unroll
      for (int n = 0; n < kGemvRows; ++n) Dec::affine(wrow[n], u, q[n], scale[n], mn[n]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float* xr = xp[r] + u * 8;
        float xv[8];
        if (a.x_vec4) {
          const float4 p = __ldg(reinterpret_cast<const float4*>(xr));
          const float4 p2 = __ldg(reinterpret_cast<const float4*>(xr) + 1);
          xv[0] = p.x, xv[1] = p.y, xv[2] = p.z, xv[3] = p.w;
          xv[4] = p2.x, xv[5] = p2.y, xv[6] = p2.z, xv[7] = p2.w;
        } else {
#pragma unroll
          for (int t = 0; t < 8; ++t) xv[t] = __ldg(xr + t);
        }
        float xsum = 0.0f;
        if constexpr (Dec::kHasMin) {
          xsum = ((xv[0] + xv[1]) + (xv[2] + xv[3])) + ((xv[4] + xv[5]) + (xv[6] + xv[7]));
        }
#pragma unroll
        for (int n = 0; n < kGemvRows; ++n) {
          float d = q[n][0] * xv[0];
#pragma unroll
          for (int t = 1; t < 8; ++t) d = fmaf(q[n][t], xv[t], d);
          acc[n][r] = fmaf(scale[n], d, acc[n][r]);
          if constexpr (Dec::kHasMin) acc[n][r] = fmaf(-mn[n], xsum, acc[n][r]);
        }
      }
    } else {
      float wv[kGemvRows];
#pragma unroll
      for (int n = 0; n < kGemvRows; ++n) Dec::decode(wrow[n], u, &wv[n]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float xv = __ldg(xp[r] + u);
#pragma unroll
        for (int n = 0; n < kGemvRows; ++n) acc[n][r] = fmaf(wv[n], xv, acc[n][r]);
      }
    }
  }
#pragma unroll
  for (int n = 0; n < kGemvRows; ++n) {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[n][r]);
      if (lane == 0) red[(n * R + r) * kGemvWarps + warp] = v;
    }
  }
  __syncthreads();
  if (tid < kGemvRows * R) {
    const int n = tid / R, r = tid % R;
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kGemvWarps; ++i) s += red[tid * kGemvWarps + i];
    if (o0 + n < a.n_out) a.y[(j0 + r) * a.n_out + o0 + n] = s;
  }
  __syncthreads();  // red is reused by the next pass
}

// Grid: x = output rows / kGemvRows, y = group. A group's rows go through in passes of up to
// RMAX rows; RMAX = 1 (decode: one row per expert) keeps the register count, and so the
// occupancy, of the common case independent of the 8-row code.
template <class Dec, int RMAX>
__global__ void __launch_bounds__(kGemvThreads) gemv_kernel(Args a) {
  __shared__ float red[kGemvRows * RMAX * kGemvWarps];
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kGemvRows;
  int64_t r0, r1;
  const uint8_t* w = group_range(a, static_cast<int>(blockIdx.y), r0, r1);
  if (!w) return fill_nan(a, r0, r1, o0, kGemvRows);
  for (int64_t j = r0; j < r1; j += RMAX) {
    if constexpr (RMAX == 1) {
      gemv_pass<Dec, 1>(a, w, o0, j, red);
    } else {
      switch (static_cast<int>(min(static_cast<int64_t>(RMAX), r1 - j))) {
        case 1:
          gemv_pass<Dec, 1>(a, w, o0, j, red);
          break;
        case 2:
          gemv_pass<Dec, 2>(a, w, o0, j, red);
          break;
        case 3:
          gemv_pass<Dec, 3>(a, w, o0, j, red);
          break;
        case 4:
          gemv_pass<Dec, 4>(a, w, o0, j, red);
          break;
        case 5:
          gemv_pass<Dec, 5>(a, w, o0, j, red);
          break;
        case 6:
          gemv_pass<Dec, 6>(a, w, o0, j, red);
          break;
        case 7:
          gemv_pass<Dec, 7>(a, w, o0, j, red);
          break;
        default:
          gemv_pass<Dec, 8>(a, w, o0, j, red);
          break;
      }
    }
  }
}

// ---- float weights, one activation row per group: a block per output row ------------------------
//
// The GEMV above gives the 128-row F32 router only 32 blocks, whose threads walk 16 dependent
// steps each: 8.7 µs a launch with its weights in DRAM, 4% of the H200's copy bandwidth
// (moe-bench-cuda-kernels). A block of 256 threads per row issues 8 loads per thread at once.

constexpr int kRowThreads = 256;

// One output of a float-weight row: the sum over n_in of wr[i] * x[i], by a block of kRowThreads
// (all of them call it; thread 0 gets the sum). The decode router (router.cu) uses it too, so its
// logits equal this GEMV's bit for bit.
template <class Dec>
__device__ __forceinline__ float float_row_dot(const uint8_t* wr, const float* x, int64_t n_in,
                                               float (&red)[kRowThreads / 32]) {
  const int tid = static_cast<int>(threadIdx.x);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = tid;
  for (; i + 7 * kRowThreads < n_in; i += 8 * kRowThreads) {
    float wv[8], xv[8];
#pragma unroll
    for (int t = 0; t < 8; ++t) {
      Dec::decode(wr, i + t * kRowThreads, &wv[t]);
      xv[t] = __ldg(x + i + t * kRowThreads);
    }
#pragma unroll
    for (int t = 0; t < 8; ++t) acc[t % 4] = fmaf(wv[t], xv[t], acc[t % 4]);
  }
  for (; i < n_in; i += kRowThreads) {
    float wv;
    Dec::decode(wr, i, &wv);
    acc[0] = fmaf(wv, __ldg(x + i), acc[0]);
  }
  const float s = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
  if (tid % 32 == 0) red[tid / 32] = s;
  __syncthreads();
  float total = 0.0f;
  if (tid == 0) {
#pragma unroll
    for (int k = 0; k < kRowThreads / 32; ++k) total += red[k];
  }
  __syncthreads();  // red may be reused at once
  return total;
}

template <class Dec>
__global__ void __launch_bounds__(kRowThreads) gemv_float_row_kernel(Args a) {
  __shared__ float red[kRowThreads / 32];
  int64_t r0, r1;
  const uint8_t* w = group_range(a, static_cast<int>(blockIdx.y), r0, r1);
  const auto o = static_cast<int64_t>(blockIdx.x);
  if (!w) return fill_nan(a, r0, r1, o, 1);
  const uint8_t* wr = w + o * static_cast<int64_t>(a.row_bytes);
  for (int64_t j = r0; j < r1; ++j) {
    const float total = float_row_dot<Dec>(wr, x_row(a, j), a.n_in, red);
    if (threadIdx.x == 0) a.y[j * a.n_out + o] = total;
  }
}

// ---- 16-bit float weights, one activation row, many outputs: a warp per output row --------------
//
// For the output head and the attention projections of 16-bit models (gpt-oss's bf16) the
// block-per-row kernel above keeps 256 threads on a row of a few thousand 2-byte weights: each
// thread loads 2 bytes a step and the block's reduction costs more than its loads. A warp per
// row reads 8 weights (16 bytes) per lane and step, two steps in flight, and reduces with
// shuffles. Matrices of fewer rows (the routers, whose device kernel reproduces the block-per-row
// sum bit for bit, router.cu) keep the kernel above.

constexpr int kWarpRowThreads = 256;  // 8 output rows per block
constexpr int kWarpRows = kWarpRowThreads / 32;
constexpr int64_t kWarpRowMinOut = 1024;

// Eight 16-bit weights of one 16-byte load as floats.
template <class Dec>
__device__ __forceinline__ void decode_half8(const uint4 v, float (&w)[8]) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<Dec, dq::BF16>) {
      w[2 * i] = __uint_as_float(u[i] << 16);
      w[2 * i + 1] = __uint_as_float(u[i] & 0xFFFF0000u);
    } else {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&u[i]));
      w[2 * i] = f.x;
      w[2 * i + 1] = f.y;
    }
  }
}

// Needs n_in % 8 == 0, 16-byte aligned weight rows and float4-aligned activations, one group
// (gemv_half_warp_serves).
template <class Dec>
__global__ void __launch_bounds__(kWarpRowThreads) gemv_half_warp_kernel(Args a) {
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarpRows + warp;
  if (o >= a.n_out) return;
  const auto* wr = reinterpret_cast<const uint4*>(a.w + o * static_cast<int64_t>(a.row_bytes));
  const int64_t n_vec = a.n_in / 8;
  for (int64_t j = 0; j < a.n_rows; ++j) {
    const auto* x = reinterpret_cast<const float4*>(x_row(a, j));
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t v = lane;
    for (; v + 32 < n_vec; v += 64) {  // two loads in flight per lane
      const uint4 q0 = __ldg(wr + v), q1 = __ldg(wr + v + 32);
      const float4 x0 = __ldg(x + 2 * v), x1 = __ldg(x + 2 * v + 1);
      const float4 x2 = __ldg(x + 2 * v + 64), x3 = __ldg(x + 2 * v + 65);
      float w0[8], w1[8];
      decode_half8<Dec>(q0, w0);
      decode_half8<Dec>(q1, w1);
      acc[0] = fmaf(w0[0], x0.x, fmaf(w0[1], x0.y, fmaf(w0[2], x0.z, fmaf(w0[3], x0.w, acc[0]))));
      acc[1] = fmaf(w0[4], x1.x, fmaf(w0[5], x1.y, fmaf(w0[6], x1.z, fmaf(w0[7], x1.w, acc[1]))));
      acc[2] = fmaf(w1[0], x2.x, fmaf(w1[1], x2.y, fmaf(w1[2], x2.z, fmaf(w1[3], x2.w, acc[2]))));
      acc[3] = fmaf(w1[4], x3.x, fmaf(w1[5], x3.y, fmaf(w1[6], x3.z, fmaf(w1[7], x3.w, acc[3]))));
    }
    for (; v < n_vec; v += 32) {
      const uint4 q0 = __ldg(wr + v);
      const float4 x0 = __ldg(x + 2 * v), x1 = __ldg(x + 2 * v + 1);
      float w0[8];
      decode_half8<Dec>(q0, w0);
      acc[0] = fmaf(w0[0], x0.x, fmaf(w0[1], x0.y, fmaf(w0[2], x0.z, fmaf(w0[3], x0.w, acc[0]))));
      acc[1] = fmaf(w0[4], x1.x, fmaf(w0[5], x1.y, fmaf(w0[6], x1.z, fmaf(w0[7], x1.w, acc[1]))));
    }
    const float s = warp_sum((acc[0] + acc[1]) + (acc[2] + acc[3]));
    if (lane == 0) a.y[j * a.n_out + o] = s;
  }
}

// Whether gemv_half_warp_kernel takes the product (checked on the host: one group of one
// activation row, and the alignments its vector loads need).
inline bool gemv_half_warp_serves(const WeightProduct& p, const Args& a) {
  return !p.offsets && p.n_rows == 1 && p.n_out >= kWarpRowMinOut && p.n_in % 8 == 0 &&
         p.row_bytes % 16 == 0 && reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && a.x_vec4;
}

// ---- tiled: 64 output rows × 64 activation rows per block, K in steps of 32 ---------------------

constexpr int kTileO = 64;
constexpr int kTileR = 64;
constexpr int kTileK = 32;
constexpr int kTileThreads = 256;
// Row padding of the k-major tiles: keeps float4 reads aligned and spreads the transposing stores
// over 8 banks instead of 1.
constexpr int kPad = 4;

// Grid: x = output tiles, y = group, z = row tiles (a block strides over further row tiles).
// Thread (ty, tx) computes activation rows 4ty..4ty+3 × outputs 4tx..4tx+3 of the tile.
template <class Dec>
__global__ void __launch_bounds__(kTileThreads) gemm_tiled_kernel(Args a) {
  __shared__ __align__(16) float ws[kTileK][kTileO + kPad];
  __shared__ __align__(16) float xs[kTileK][kTileR + kPad];
  int64_t r0, r1;
  const uint8_t* w = group_range(a, static_cast<int>(blockIdx.y), r0, r1);
  const int64_t count = r1 - r0;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kTileO;
  if (!w) {
    if (blockIdx.z == 0) fill_nan(a, r0, r1, o0, kTileO);
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const int tx = tid % 16, ty = tid / 16;
  const int kc = tid % kTileK;  // column this thread loads of the activation tile
  constexpr int kUnitsPerRow = kTileK / Dec::kPer;
  constexpr int kDecodes = kTileO * kUnitsPerRow / kTileThreads;  // units per thread per tile
  static_assert(kDecodes * kTileThreads == kTileO * kUnitsPerRow);
  for (int64_t rt = static_cast<int64_t>(blockIdx.z) * kTileR; rt < count;
       rt += static_cast<int64_t>(gridDim.z) * kTileR) {
    const float* xrow[8];  // rows tid/32 + 8i of the tile, null past the group's end
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int64_t jl = rt + tid / kTileK + 8 * i;
      xrow[i] = jl < count ? x_row(a, r0 + jl) : nullptr;
    }
    float acc[4][4] = {};
    for (int64_t k0 = 0; k0 < a.n_in; k0 += kTileK) {
      // Everything is loaded into registers before the first shared store, so no load waits
      // behind a store the compiler cannot prove unrelated.
      float v[kDecodes][Dec::kPer];
#pragma unroll
      for (int it = 0; it < kDecodes; ++it) {
        const int u = tid + it * kTileThreads;
        const int64_t o = o0 + u / kUnitsPerRow;
        const int64_t k = k0 + static_cast<int64_t>(u % kUnitsPerRow) * Dec::kPer;
        if (o < a.n_out && k < a.n_in) {
          Dec::decode(w + o * static_cast<int64_t>(a.row_bytes), k / Dec::kPer, v[it]);
        } else {
#pragma unroll
          for (int t = 0; t < Dec::kPer; ++t) v[it][t] = 0.0f;
        }
      }
      float xv[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        xv[i] = (xrow[i] && k0 + kc < a.n_in) ? __ldg(xrow[i] + k0 + kc) : 0.0f;
      }
#pragma unroll
      for (int it = 0; it < kDecodes; ++it) {
        const int u = tid + it * kTileThreads;
        const int ol = u / kUnitsPerRow, ku = u % kUnitsPerRow;
#pragma unroll
        for (int t = 0; t < Dec::kPer; ++t) ws[ku * Dec::kPer + t][ol] = v[it][t];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) xs[kc][tid / kTileK + 8 * i] = xv[i];
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < kTileK; ++kk) {
        const float4 xv = *reinterpret_cast<const float4*>(&xs[kk][4 * ty]);
        const float4 wv = *reinterpret_cast<const float4*>(&ws[kk][4 * tx]);
        const float xa[4] = {xv.x, xv.y, xv.z, xv.w};
        const float wa[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
          for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(xa[i], wa[j], acc[i][j]);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t jl = rt + 4 * ty + i;
      if (jl >= count) break;
      float* yr = a.y + (r0 + jl) * a.n_out;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t o = o0 + 4 * tx + j;
        if (o < a.n_out) yr[o] = acc[i][j];
      }
    }
  }
}

}  // namespace moe::cuda::detail

#include "kernels/cuda/matmul_mma.cuh"
#include "kernels/cuda/matmul_mmq.cuh"

namespace moe::cuda::detail {

// Q4_K with one activation row per group, the activation row staged in shared memory
// (gemv_q4k.cu); false (nothing launched) for rows too long to stage.
bool launch_gemv_q4k(const Args& a, unsigned n_groups, cudaStream_t stream);
// Q6_K likewise (gemv_q6k.cu); false also for products of fewer rows than it pays for.
bool launch_gemv_q6k(const Args& a, unsigned n_groups, cudaStream_t stream);

template <class Dec>
void launch_weight_product_typed(const WeightProduct& p, cudaStream_t stream) {
  Args a{};
  a.n_in = p.n_in;
  a.n_out = p.n_out;
  a.row_bytes = p.row_bytes;
  a.w = static_cast<const uint8_t*>(p.w);
  a.w_ptrs = p.w_ptrs;
  a.offsets = p.offsets;
  a.n_rows = p.n_rows;
  a.x_rows = p.x_rows;
  a.x = p.x;
  a.x_stride = p.x_stride;
  a.y = p.y;
  a.x_vec4 = reinterpret_cast<uintptr_t>(p.x) % 16 == 0 && p.x_stride % 4 == 0;
  const unsigned n_groups = p.offsets ? static_cast<unsigned>(p.n_groups) : 1u;
  if constexpr (std::is_same_v<Dec, dq::Q4_K>) {
    if (p.max_rows_per_group == 1 && launch_gemv_q4k(a, n_groups, stream)) return;
  } else if constexpr (std::is_same_v<Dec, dq::Q6_K>) {
    if (p.max_rows_per_group == 1 && launch_gemv_q6k(a, n_groups, stream)) return;
  } else if constexpr (std::is_same_v<Dec, dq::F16> || std::is_same_v<Dec, dq::BF16>) {
    if (gemv_half_warp_serves(p, a)) {
      gemv_half_warp_kernel<Dec>
          <<<static_cast<unsigned>(ceil_div(p.n_out, kWarpRows)), kWarpRowThreads, 0, stream>>>(a);
      MOE_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  if constexpr (Dec::kPer == 1) {
    if (p.max_rows_per_group == 1) {
      gemv_float_row_kernel<Dec>
          <<<dim3(static_cast<unsigned>(p.n_out), n_groups), kRowThreads, 0, stream>>>(a);
      MOE_CUDA_CHECK(cudaGetLastError());
      return;
    }
  }
  if (p.max_rows_per_group <= 8) {
    const dim3 grid(static_cast<unsigned>(ceil_div(p.n_out, kGemvRows)), n_groups);
    if (p.max_rows_per_group == 1) {
      gemv_kernel<Dec, 1><<<grid, kGemvThreads, 0, stream>>>(a);
    } else {
      gemv_kernel<Dec, 8><<<grid, kGemvThreads, 0, stream>>>(a);
    }
  } else if constexpr (Dec::kPer == 8) {
    if (int8_products_enabled()) {
      // Quantized blocks on sm_80+: int8 tensor cores (matmul_mmq.cuh).
      const int64_t row_tiles = std::min<int64_t>(ceil_div(p.max_rows_per_group, kMmqR), 65535);
      const dim3 grid(static_cast<unsigned>(ceil_div(p.n_out, kMmqO)), n_groups,
                      static_cast<unsigned>(row_tiles));
      gemm_mmq_kernel<Dec><<<grid, kMmqThreads, 0, stream>>>(a);
    } else {
      // Older GPUs: FP16 tensor cores (matmul_mma.cuh).
      const int64_t row_tiles = std::min<int64_t>(ceil_div(p.max_rows_per_group, kMmaR), 65535);
      const dim3 grid(static_cast<unsigned>(ceil_div(p.n_out, kMmaO)), n_groups,
                      static_cast<unsigned>(row_tiles));
      gemm_mma_kernel<Dec><<<grid, kMmaThreads, 0, stream>>>(a);
    }
  } else {
    // Float weights keep FP32 arithmetic: their models' tolerances are tight.
    const int64_t row_tiles = std::min<int64_t>(ceil_div(p.max_rows_per_group, kTileR), 65535);
    const dim3 grid(static_cast<unsigned>(ceil_div(p.n_out, kTileO)), n_groups,
                    static_cast<unsigned>(row_tiles));
    gemm_tiled_kernel<Dec><<<grid, kTileThreads, 0, stream>>>(a);
  }
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda::detail
