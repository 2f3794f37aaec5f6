// RMSNorm, one block per row: the sum of squares in double (as the CPU), then the same float
// operations as coordinator/model/rmsnorm.cpp.
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/elementwise.h"
#include "kernels/cuda/rms_scale.cuh"
#include "kernels/cuda/rmsnorm.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 128;

// Values per thread kept in registers when the residual add is fused: rows up to 2048 floats.
constexpr int kCached = 16;

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
  detail::rms_scale<kThreads>(sum, partial, &scale_s, n, eps);
  const float scale = scale_s;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) yr[i] = xr[i] * scale * w[i];
}

// The residual row a block holds in registers (thread t: elements t + u * T, u < C; 0 past the
// row, which adds nothing to the sum) stored back to x, then y = rmsnorm(x) from the registers:
// the float operations of rmsnorm_kernel in its order, so its results, bit for bit.
template <int T, int C>
__device__ __forceinline__ void store_and_norm(const float (&v)[C], float* __restrict__ x,
                                               const float* __restrict__ w, float* __restrict__ y,
                                               int64_t n, float eps) {
  __shared__ double partial[T / 32];
  __shared__ float scale_s;
  const int tid = static_cast<int>(threadIdx.x);
  double sum = 0;
#pragma unroll
  for (int u = 0; u < C; ++u) {
    const int64_t i = tid + u * T;
    if (i < n) x[i] = v[u];
    const double d = v[u];
    sum += d * d;
  }
  detail::rms_scale<T>(sum, partial, &scale_s, n, eps);
  const float scale = scale_s;
#pragma unroll
  for (int u = 0; u < C; ++u) {
    const int64_t i = tid + u * T;
    if (i < n) y[i] = v[u] * scale * w[i];
  }
}

// x += delta, then y = rmsnorm(x), for rows of at most kCached * kThreads, from registers: one
// batch of loads instead of a chain of dependent load-store pairs (adding and storing element by
// element serialized a first version: 6.2 us against 2.7 for the norm alone). The same float
// operations in the same order as the add followed by rmsnorm_kernel (a sum element past the row
// is 0 and adds nothing), so the results are bit-identical.
__global__ void __launch_bounds__(kThreads)
    add_rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ delta,
                       const float* __restrict__ w, float* __restrict__ y, int64_t n, float eps) {
  const int64_t off = static_cast<int64_t>(blockIdx.x) * n;
  const int tid = static_cast<int>(threadIdx.x);
  float v[kCached];
#pragma unroll
  for (int u = 0; u < kCached; ++u) {
    const int64_t i = tid + u * kThreads;
    v[u] = i < n ? x[off + i] + delta[off + i] : 0.0f;
  }
  store_and_norm<kThreads>(v, x + off, w, y + off, n, eps);
}

// One token's MoE combine into the residual, then the next norm: x[c] += sum over j < k of
// weights[j] * y[j * n + c] (combine_rows' order and rounding: products and sums rounded
// separately, from 0), then out = rmsnorm(x) as add_rmsnorm_kernel. One block of 1024 threads,
// two columns each, so a thread's k loads per column are few and all in flight at once (128
// threads with 16 columns each took 12.4 us, against 3.3 + 2.6 for the two launches it
// replaces).
constexpr int kCombineThreads = 1024;
constexpr int kCombineCached = 2;
__global__ void __launch_bounds__(kCombineThreads)
    combine_rmsnorm_kernel(const float* __restrict__ y, const float* __restrict__ weights, int k,
                           float* __restrict__ x, const float* __restrict__ w,
                           float* __restrict__ out, int64_t n, float eps) {
  const int tid = static_cast<int>(threadIdx.x);
  float v[kCombineCached];
#pragma unroll
  for (int u = 0; u < kCombineCached; ++u) {
    const int64_t i = tid + u * kCombineThreads;
    float s = 0.0f;
    if (i < n) {
#pragma unroll 8
      for (int j = 0; j < k; ++j) s = __fadd_rn(s, __fmul_rn(weights[j], y[j * n + i]));
    }
    v[u] = i < n ? x[i] + s : 0.0f;
  }
  store_and_norm<kCombineThreads>(v, x, w, out, n, eps);
}

void check_shape(int64_t n_rows, int64_t n, const char* what) {
  if (n_rows < 0 || n < 1) {
    throw Error(std::string(what) + ": invalid shape " + std::to_string(n_rows) + " x " +
                std::to_string(n));
  }
  if (n_rows > 0x7FFFFFFF) throw Error(std::string(what) + ": too many rows");
}

}  // namespace

void rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps,
             cudaStream_t stream) {
  check_shape(n_rows, n, "rmsnorm");
  if (n_rows == 0) return;
  if (!x || !w || !y) throw Error("rmsnorm: null device pointer");
  rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(x, w, y, n, eps);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void add_rmsnorm(float* x, const float* delta, const float* w, float* y, int64_t n_rows, int64_t n,
                 float eps, cudaStream_t stream) {
  check_shape(n_rows, n, "add_rmsnorm");
  if (n_rows == 0) return;
  if (!x || !delta || !w || !y) throw Error("add_rmsnorm: null device pointer");
  if (y == x) throw Error("add_rmsnorm: y must not alias x");
  if (n > kCached * kThreads) {
    add_inplace(x, delta, n_rows * n, stream);
    rmsnorm(x, w, y, n_rows, n, eps, stream);
    return;
  }
  add_rmsnorm_kernel<<<static_cast<unsigned>(n_rows), kThreads, 0, stream>>>(x, delta, w, y, n,
                                                                             eps);
  MOE_CUDA_CHECK(cudaGetLastError());
}

bool combine_rmsnorm_supported(int64_t n) {
  return n >= 1 && n <= kCombineCached * kCombineThreads;
}

void combine_rmsnorm(const float* y, const float* weights, int64_t k, float* x, const float* w,
                     float* out, int64_t n, float eps, cudaStream_t stream) {
  if (!combine_rmsnorm_supported(n)) {
    throw Error("combine_rmsnorm: row of " + std::to_string(n) + " outside [1, " +
                std::to_string(kCombineCached * kCombineThreads) + "]");
  }
  if (k < 1 || k > 64) throw Error("combine_rmsnorm: k " + std::to_string(k) + " outside [1, 64]");
  if (!y || !weights || !x || !w || !out) throw Error("combine_rmsnorm: null device pointer");
  if (out == x) throw Error("combine_rmsnorm: out must not alias x");
  combine_rmsnorm_kernel<<<1, kCombineThreads, 0, stream>>>(y, weights, static_cast<int>(k), x, w,
                                                            out, n, eps);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
