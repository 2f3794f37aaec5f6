// Internal: the block reduction every RMSNorm kernel shares, so their double sums (and so their
// results) agree bit for bit: rmsnorm.cu, qk_norm_rope.cu, the gated norm of qwen35_ops.cu.
#pragma once

#include <cstdint>

namespace moe::cuda::detail {

// Each of the T threads' sum of squares (in double) summed over the block in a fixed order:
// warp shuffles, then the warps' partials in order. After the call *scale_s = 1 / sqrt(mean +
// eps) for every thread (mean over n values). partial: T / 32 doubles of shared memory.
template <int T>
__device__ __forceinline__ void rms_scale(double sum, double* partial, float* scale_s, int64_t n,
                                          float eps) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, m);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < T / 32; ++i) total += partial[i];
    const float mean = static_cast<float>(total / static_cast<double>(n));
    *scale_s = 1.0f / sqrtf(mean + eps);
  }
  __syncthreads();
}

}  // namespace moe::cuda::detail
