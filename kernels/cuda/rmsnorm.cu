// RMSNorm, one block per row: the sum of squares in double (as the CPU), then the same float
// operations as coordinator/model/rmsnorm.cpp.
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rmsnorm.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 128;

// No __restrict__: y may alias x (every element is read, then written, by the same thread).
__global__ void __launch_bounds__(kThreads)
    rmsnorm_kernel(const float* x, const float* __restrict__ w, float* y, int64_t n, float eps) {
  __shared__ double partial[kThreads / 32];
  __shared__ float scale_s;
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * n;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    const double v = xr[i];
    sum += v * v;  // exact product of two floats, as the CPU's
  }
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, m);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0;
    for (int i = 0; i < kThreads / 32; ++i) total += partial[i];
    const float mean = static_cast<float>(total / static_cast<double>(n));
    scale_s = 1.0f / sqrtf(mean + eps);
  }
  __syncthreads();
  const float scale = scale_s;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) yr[i] = xr[i] * scale * w[i];
}

}  // namespace

void rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps,
             cudaStream_t stream) {
  if (n_rows < 0 || n < 1) {
    throw Error("rmsnorm: invalid shape " + std::to_string(n_rows) + " x " + std::to_string(n));
  }
  if (n_rows > 0x7FFFFFFF) throw Error("rmsnorm: too many rows");
  if (n_rows == 0) return;
  if (!x || !w || !y) throw Error("rmsnorm: null device pointer");
  rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(x, w, y, n, eps);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
