// Internal: the tensor-core weight product for batches of quantized weights (prefill), used by
// launch_weight_product_typed() for block types. Included by matmul_kernels.cuh only.
//
// A block computes 64 activation rows × 64 outputs, K in steps of 32: each step decodes a 64 × 32
// weight tile (the same decoder as every other kernel) and the matching activations into FP16
// tiles in shared memory, and four warps multiply them with WMMA 16×16×16 fragments, accumulating
// in FP32. The SIMT kernel spent most of its time on FP32 multiply-adds (a 512-token prefill runs
// at ~15% of the FP32 peak); the tensor cores take those off the critical path, leaving the
// decode. Operands rounded to FP16 add a relative error of ~2^-11 per product (like llama.cpp's
// FP16 operands for cuBLAS, or its int8 activations); float weight types keep the FP32 kernel.
// Activations beyond FP16's range saturate instead of becoming inf.
#pragma once

#include <cuda_fp16.h>
#include <mma.h>

namespace moe::cuda::detail {

constexpr int kMmaO = 64;  // outputs per block
constexpr int kMmaR = 64;  // activation rows per block
constexpr int kMmaK = 32;  // K per step
constexpr int kMmaThreads = 128;
constexpr int kMmaPadH = 8;  // halves of row padding: rows stay 32-byte aligned for WMMA loads
constexpr int kMmaPadF = 4;  // floats of row padding of the output tile

__device__ __forceinline__ half to_half_saturated(float v) {
  return __float2half_rn(fminf(fmaxf(v, -65504.0f), 65504.0f));
}

// Grid: x = output tiles, y = group, z = row tiles (a block strides over further row tiles).
template <class Dec>
__global__ void __launch_bounds__(kMmaThreads) gemm_mma_kernel(Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 700
  using namespace nvcuda;
  __shared__ __align__(32) half ws[kMmaO][kMmaK + kMmaPadH];  // [output][k]
  __shared__ __align__(32) half xs[kMmaR][kMmaK + kMmaPadH];  // [row][k]
  __shared__ __align__(32) float ys[kMmaR][kMmaO + kMmaPadF];
  int64_t r0, r1;
  const uint8_t* w = group_range(a, static_cast<int>(blockIdx.y), r0, r1);
  const int64_t count = r1 - r0;
  const int64_t o0 = static_cast<int64_t>(blockIdx.x) * kMmaO;
  if (!w) {
    if (blockIdx.z == 0) fill_nan(a, r0, r1, o0, kMmaO);
    return;
  }
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / 32, lane = tid % 32;
  // Warp (w / 2, w % 2) owns rows 32 * (w / 2) .. +31 and outputs 32 * (w % 2) .. +31 of the tile.
  const int wr = 32 * (warp / 2), wo = 32 * (warp % 2);
  constexpr int kUnitsPerRow = kMmaK / Dec::kPer;
  constexpr int kDecodes = kMmaO * kUnitsPerRow / kMmaThreads;  // weight units per thread
  static_assert(kDecodes * kMmaThreads == kMmaO * kUnitsPerRow);
  constexpr int kXLoads = kMmaR * kMmaK / kMmaThreads;  // activations per thread per step
  for (int64_t rt = static_cast<int64_t>(blockIdx.z) * kMmaR; rt < count;
       rt += static_cast<int64_t>(gridDim.z) * kMmaR) {
    // Thread t loads column `lane` of rows warp + 4i: each warp reads 32 consecutive floats.
    const float* xrow[kXLoads];
#pragma unroll
    for (int i = 0; i < kXLoads; ++i) {
      const int64_t jl = rt + warp + 4 * i;
      xrow[i] = jl < count ? x_row(a, r0 + jl) : nullptr;
    }
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    }
    for (int64_t k0 = 0; k0 < a.n_in; k0 += kMmaK) {
      // All loads into registers first, then the shared stores (as in the FP32 kernel).
      float v[kDecodes][Dec::kPer];
#pragma unroll
      for (int it = 0; it < kDecodes; ++it) {
        const int u = tid + it * kMmaThreads;
        const int64_t o = o0 + u / kUnitsPerRow;
        const int64_t k = k0 + static_cast<int64_t>(u % kUnitsPerRow) * Dec::kPer;
        if (o < a.n_out && k < a.n_in) {
          Dec::decode(w + o * static_cast<int64_t>(a.row_bytes), k / Dec::kPer, v[it]);
        } else {
#pragma unroll
          for (int t = 0; t < Dec::kPer; ++t) v[it][t] = 0.0f;
        }
      }
      float xv[kXLoads];
#pragma unroll
      for (int i = 0; i < kXLoads; ++i) {
        xv[i] = (xrow[i] && k0 + lane < a.n_in) ? __ldg(xrow[i] + k0 + lane) : 0.0f;
      }
#pragma unroll
      for (int it = 0; it < kDecodes; ++it) {
        const int u = tid + it * kMmaThreads;
        const int ol = u / kUnitsPerRow, kl = (u % kUnitsPerRow) * Dec::kPer;
#pragma unroll
        for (int t = 0; t < Dec::kPer; ++t) ws[ol][kl + t] = __float2half_rn(v[it][t]);
      }
#pragma unroll
      for (int i = 0; i < kXLoads; ++i) xs[warp + 4 * i][lane] = to_half_saturated(xv[i]);
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < kMmaK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          wmma::load_matrix_sync(fa[i], &xs[wr + 16 * i][kk], kMmaK + kMmaPadH);
        }
        // B = W^T: element (k, o) is ws[o][k], i.e. column-major with the same stride.
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          wmma::load_matrix_sync(fb[j], &ws[wo + 16 * j][kk], kMmaK + kMmaPadH);
        }
#pragma unroll
        for (int i = 0; i < 2; ++i) {
#pragma unroll
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
        }
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wmma::store_matrix_sync(&ys[wr + 16 * i][wo + 16 * j], acc[i][j], kMmaO + kMmaPadF,
                                wmma::mem_row_major);
      }
    }
    __syncthreads();
    for (int e = tid; e < kMmaR * kMmaO; e += kMmaThreads) {
      const int rl = e / kMmaO, ol = e % kMmaO;
      const int64_t jl = rt + rl, o = o0 + ol;
      if (jl < count && o < a.n_out) a.y[(r0 + jl) * a.n_out + o] = ys[rl][ol];
    }
    __syncthreads();  // ys is rewritten by the next row tile
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for a GPU without tensor cores: fail loudly rather than leave y unwritten
#else
  (void)a;
#endif
}

}  // namespace moe::cuda::detail
