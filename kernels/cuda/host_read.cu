#include <algorithm>
#include <cstdint>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/host_read.h"

namespace moe::cuda {
namespace {

constexpr int kThreads = 256;

// Many blocks keep many PCIe reads in flight: one block's loads would wait a round trip each.
unsigned blocks_for(size_t units) {
  const size_t b = (units + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::clamp<size_t>(b, 1, 1024));
}

__global__ void copy_kernel(uint4* dst, const uint4* src, size_t n16, unsigned char* dst_tail,
                            const unsigned char* src_tail, unsigned tail) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n16;
       i += stride) {
    dst[i] = src[i];
  }
  if (blockIdx.x == 0 && threadIdx.x < tail) dst_tail[threadIdx.x] = src_tail[threadIdx.x];
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += stride) {
    x[i] += y[i];
  }
}

void check_aligned(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    throw Error(std::string("copy_from_host: ") + what + " is not 16-byte aligned");
  }
}

}  // namespace

void copy_from_host(void* dst, const void* host_src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (!dst || !host_src) throw Error("copy_from_host: null pointer");
  check_aligned(dst, "destination");
  check_aligned(host_src, "source");
  const size_t n16 = bytes / 16;
  const auto tail = static_cast<unsigned>(bytes % 16);
  copy_kernel<<<blocks_for(std::max<size_t>(n16, 1)), kThreads, 0, stream>>>(
      static_cast<uint4*>(dst), static_cast<const uint4*>(host_src), n16,
      static_cast<unsigned char*>(dst) + n16 * 16,
      static_cast<const unsigned char*>(host_src) + n16 * 16, tail);
  MOE_CUDA_CHECK(cudaGetLastError());
}

void add_from_host(float* x, const float* host_y, int64_t n, cudaStream_t stream) {
  if (n < 0) throw Error("add_from_host: negative element count " + std::to_string(n));
  if (n == 0) return;
  if (!x || !host_y) throw Error("add_from_host: null pointer");
  add_kernel<<<blocks_for(static_cast<size_t>(n)), kThreads, 0, stream>>>(x, host_y, n);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
