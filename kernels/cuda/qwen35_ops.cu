// The element-wise ops of qwen35moe: grid-stride loops with the CPU's float operations (accurate
// expf/logf, products and sums rounded separately where the CPU rounds them), and the gated
// RMSNorm one block per row like rmsnorm.cu.
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/launch_util.cuh"
#include "kernels/cuda/qwen35_ops.h"
#include "kernels/cuda/rms_scale.cuh"

namespace moe::cuda {
namespace {

__device__ __forceinline__ float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }
__device__ __forceinline__ float silu_f(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float softplus_f(float v) {
  return v > 20.0f ? v : logf(1.0f + expf(v));
}

__global__ void delta_net_gates_kernel(float* __restrict__ beta, float* __restrict__ g,
                                       const float* __restrict__ dt_bias,
                                       const float* __restrict__ ssm_a, int64_t n,
                                       int64_t n_heads) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) {
    const int64_t h = i % n_heads;
    beta[i] = sigmoid_f(beta[i]);
    g[i] = ssm_a[h] * softplus_f(g[i] + dt_bias[h]);
  }
}

constexpr int kNormThreads = 128;

// No __restrict__ on x/y: y may alias x (each element is read, then written, by one thread).
__global__ void __launch_bounds__(kNormThreads)
    rmsnorm_gated_kernel(const float* x, const float* __restrict__ w, const float* z, float* y,
                         int64_t n, float eps) {
  __shared__ double partial[kNormThreads / 32];
  __shared__ float scale_s;
  const int64_t off = static_cast<int64_t>(blockIdx.x) * n;
  const float* xr = x + off;
  const float* zr = z + off;
  float* yr = y + off;
  double sum = 0;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    const double v = xr[i];
    sum += v * v;  // exact in double, as the CPU
  }
  detail::rms_scale<kNormThreads>(sum, partial, &scale_s, n, eps);
  const float scale = scale_s;
  for (int64_t i = threadIdx.x; i < n; i += kNormThreads) {
    // The CPU normalizes first, then multiplies by silu(z) in a second pass.
    const float normed = xr[i] * scale * w[i];
    yr[i] = normed * silu_f(zr[i]);
  }
}

__global__ void split_query_gate_kernel(const float* __restrict__ qg, float* __restrict__ q,
                                        float* __restrict__ gate, int64_t n, int64_t head_dim) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) {
    // Output i is (token, head) pair i / head_dim, dim i % head_dim; its source row segment
    // holds the head's query then its gate.
    const int64_t pair = i / head_dim, d = i % head_dim;
    const float* src = qg + pair * 2 * head_dim + d;
    q[i] = src[0];
    gate[i] = src[head_dim];
  }
}

__global__ void mul_sigmoid_kernel(float* x, const float* gate, int64_t n) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) x[i] = x[i] * sigmoid_f(gate[i]);
}

// No __restrict__: x may alias routed or h.
__global__ void shared_expert_combine_kernel(const float* routed, const float* shared,
                                             const float* __restrict__ s, const float* h, float* x,
                                             int64_t n, int64_t n_embd) {
  for (int64_t i = grid_index(); i < n; i += grid_stride()) {
    const float sg = sigmoid_f(s[i / n_embd]);
    // No FMA: the CPU rounds the product before the sums.
    x[i] = __fadd_rn(__fadd_rn(routed[i], __fmul_rn(shared[i], sg)), h[i]);
  }
}

void check_sizes(const char* fn, int64_t rows, int64_t cols, const char* rows_name,
                 const char* cols_name) {
  if (rows < 0 || cols < 1) {
    throw Error(std::string(fn) + ": invalid shape (" + rows_name + " " + std::to_string(rows) +
                ", " + cols_name + " " + std::to_string(cols) + ")");
  }
}

}  // namespace

void delta_net_gates(float* beta, float* g, const float* dt_bias, const float* ssm_a,
                     int64_t n_tokens, int64_t n_heads, cudaStream_t stream) {
  check_sizes("delta_net_gates", n_tokens, n_heads, "n_tokens", "n_heads");
  if (n_tokens == 0) return;
  if (!beta || !g || !dt_bias || !ssm_a) throw Error("delta_net_gates: null device pointer");
  const int64_t n = n_tokens * n_heads;
  delta_net_gates_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(beta, g, dt_bias, ssm_a, n,
                                                                      n_heads);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void rmsnorm_gated(const float* x, const float* w, const float* z, float* y, int64_t n_rows,
                   int64_t n, float eps, cudaStream_t stream) {
  check_sizes("rmsnorm_gated", n_rows, n, "n_rows", "n");
  if (n_rows > 0x7FFFFFFF) throw Error("rmsnorm_gated: too many rows");
  if (n_rows == 0) return;
  if (!x || !w || !z || !y) throw Error("rmsnorm_gated: null device pointer");
  rmsnorm_gated_kernel<<<static_cast<unsigned>(n_rows), kNormThreads, 0, stream>>>(x, w, z, y, n,
                                                                                   eps);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void split_query_gate(const float* qg, float* q, float* gate, int64_t n_tokens, int64_t n_head,
                      int64_t head_dim, cudaStream_t stream) {
  check_sizes("split_query_gate", n_tokens, n_head, "n_tokens", "n_head");
  check_sizes("split_query_gate", n_tokens, head_dim, "n_tokens", "head_dim");
  if (n_tokens == 0) return;
  if (!qg || !q || !gate) throw Error("split_query_gate: null device pointer");
  const int64_t n = n_tokens * n_head * head_dim;
  split_query_gate_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(qg, q, gate, n, head_dim);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream) {
  if (n < 0) throw Error("mul_sigmoid: negative element count " + std::to_string(n));
  if (n == 0) return;
  if (!x || !gate) throw Error("mul_sigmoid: null device pointer");
  mul_sigmoid_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(x, gate, n);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void shared_expert_combine(const float* routed, const float* shared, const float* s, const float* h,
                           float* x, int64_t n_tokens, int64_t n_embd, cudaStream_t stream) {
  check_sizes("shared_expert_combine", n_tokens, n_embd, "n_tokens", "n_embd");
  if (n_tokens == 0) return;
  if (!routed || !shared || !s || !h || !x) {
    throw Error("shared_expert_combine: null device pointer");
  }
  const int64_t n = n_tokens * n_embd;
  shared_expert_combine_kernel<<<elem_blocks(n), kElemThreads, 0, stream>>>(routed, shared, s, h, x,
                                                                            n, n_embd);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
