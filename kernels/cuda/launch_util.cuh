// Grid sizing shared by the simple element-wise kernels (grid-stride loops).
#pragma once

#include <algorithm>
#include <cstdint>

namespace moe::cuda {

constexpr int kElemThreads = 256;

// Blocks for n work items of a grid-stride loop: enough to fill any GPU, never 0.
inline unsigned elem_blocks(int64_t n) {
  const int64_t b = (n + kElemThreads - 1) / kElemThreads;
  return static_cast<unsigned>(std::clamp<int64_t>(b, 1, int64_t{1} << 16));
}

__device__ __forceinline__ int64_t grid_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

}  // namespace moe::cuda
