#include <cstdint>
#include <string>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/host_read.h"
#include "kernels/cuda/launch_util.cuh"

namespace moe::cuda {
namespace {

// 16-byte units, then the last bytes % 16 one byte per thread of block 0.
__global__ void copy_kernel(uint4* dst, const uint4* src, int64_t n16, unsigned char* dst_tail,
                            const unsigned char* src_tail, unsigned tail) {
  for (int64_t i = grid_index(); i < n16; i += grid_stride()) dst[i] = src[i];
  if (blockIdx.x == 0 && threadIdx.x < tail) dst_tail[threadIdx.x] = src_tail[threadIdx.x];
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
  const auto n16 = static_cast<int64_t>(bytes / 16);
  const auto tail = static_cast<unsigned>(bytes % 16);
  // A block per 256 units: many blocks keep many PCIe reads in flight.
  copy_kernel<<<elem_blocks(n16), kElemThreads, 0, stream>>>(
      static_cast<uint4*>(dst), static_cast<const uint4*>(host_src), n16,
      static_cast<unsigned char*>(dst) + n16 * 16,
      static_cast<const unsigned char*>(host_src) + n16 * 16, tail);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
