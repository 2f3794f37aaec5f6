// One CUDA block per (row, Hadamard block): the values in shared memory, log2(block) butterfly
// passes in the CPU's order, then the 1/sqrt(block) scale -- the same float operations as the CPU
// reference, so the results match it bit for bit.
#include <cmath>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/hadamard.h"

namespace moe::cuda {
namespace {

constexpr int kMaxBlock = 1024;

__global__ void hadamard_kernel(float* x, int64_t row_stride, int64_t blocks_per_row, int block,
                                float scale) {
  __shared__ float s[kMaxBlock];
  const int64_t row = blockIdx.x / blocks_per_row, b = blockIdx.x % blocks_per_row;
  float* v = x + row * row_stride + b * block;
  for (int i = threadIdx.x; i < block; i += blockDim.x) s[i] = v[i];
  __syncthreads();
  for (int h = 1; h < block; h *= 2) {
    // Pair (j, j + h) for every j whose bit h is clear: block / 2 pairs per pass.
    for (int p = threadIdx.x; p < block / 2; p += blockDim.x) {
      const int j = (p / h) * 2 * h + p % h;
      const float a = s[j], c = s[j + h];
      s[j] = __fadd_rn(a, c);
      s[j + h] = __fsub_rn(a, c);
    }
    __syncthreads();
  }
  for (int i = threadIdx.x; i < block; i += blockDim.x) v[i] = __fmul_rn(s[i], scale);
}

}  // namespace

void hadamard_rows(float* x, int64_t n_rows, int64_t row_stride, int64_t n, int64_t block,
                   cudaStream_t stream) {
  if (block < 1 || block > kMaxBlock || (block & (block - 1)) != 0 || n < block || n % block != 0 ||
      row_stride < n || n_rows < 0 || (n_rows > 0 && x == nullptr)) {
    throw Error("hadamard_rows: block " + std::to_string(block) + ", n " + std::to_string(n) +
                ", row stride " + std::to_string(row_stride) + ": invalid shape");
  }
  if (n_rows == 0) return;
  const int64_t blocks = n_rows * (n / block);
  const float scale = 1.0f / std::sqrt(static_cast<float>(block));
  const int threads = static_cast<int>(std::min<int64_t>(block / 2 > 0 ? block / 2 : 1, 256));
  hadamard_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      x, row_stride, n / block, static_cast<int>(block), scale);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
