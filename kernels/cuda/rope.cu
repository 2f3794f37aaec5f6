// NEOX RoPE, one block per token: the block's threads build the token's cos/sin table once (the
// angle by repeated float multiplication, as rope.cpp), then rotate every head.
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/rope.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads)
    rope_kernel(float* x, int64_t row_stride, int64_t n_head, int64_t head_dim, int64_t n_half,
                int64_t pos0, float theta_scale) {
  extern __shared__ float cs[];  // cos, sin of dim i at 2i, 2i+1
  const int64_t t = blockIdx.x;
  const float pos = static_cast<float>(pos0 + t);
  for (int64_t i = threadIdx.x; i < n_half; i += kThreads) {
    float theta = pos;
    for (int64_t k = 0; k < i; ++k) theta = __fmul_rn(theta, theta_scale);
    cs[2 * i] = cosf(theta);
    cs[2 * i + 1] = sinf(theta);
  }
  __syncthreads();
  float* row = x + t * row_stride;
  for (int64_t idx = threadIdx.x; idx < n_head * n_half; idx += kThreads) {
    const int64_t h = idx / n_half, i = idx % n_half;
    float* v = row + h * head_dim;
    const float c = cs[2 * i], s = cs[2 * i + 1];
    const float x0 = v[i], x1 = v[i + n_half];
    // Each product rounded on its own, as the CPU computes it (no FMA).
    v[i] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[i + n_half] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

}  // namespace

void rope_neox(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_head, int64_t head_dim,
               int64_t n_rot, int64_t pos0, float freq_base, cudaStream_t stream) {
  if (n_tokens < 0 || n_head < 1 || head_dim < 1 || pos0 < 0) {
    throw Error("rope_neox: invalid shape (n_tokens " + std::to_string(n_tokens) + ", n_head " +
                std::to_string(n_head) + ", head_dim " + std::to_string(head_dim) + ", pos0 " +
                std::to_string(pos0) + ")");
  }
  if (n_rot < 2 || n_rot % 2 != 0 || n_rot > head_dim || n_rot > 8192) {
    throw Error("rope_neox: n_rot " + std::to_string(n_rot) + " must be even, in [2, head_dim " +
                std::to_string(head_dim) + "]");
  }
  if (row_stride < n_head * head_dim) {
    throw Error("rope_neox: row_stride " + std::to_string(row_stride) + " < n_head * head_dim");
  }
  if (n_tokens > 0x7FFFFFFF) throw Error("rope_neox: too many tokens");
  if (n_tokens == 0) return;
  if (!x) throw Error("rope_neox: null device pointer");
  // The scale on the host with the same call as rope.cpp, so the angles match the CPU's bit for
  // bit (only cos/sin differ, by an ulp or two).
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(n_rot));
  const int64_t n_half = n_rot / 2;
  const size_t smem = static_cast<size_t>(n_rot) * sizeof(float);
  rope_kernel<<<static_cast<unsigned>(n_tokens), kThreads, smem, stream>>>(
      x, row_stride, n_head, head_dim, n_half, pos0, theta_scale);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
