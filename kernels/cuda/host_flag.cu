#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/host_flag.h"

namespace moe::cuda {
namespace {

__global__ void wait_host_flag_kernel(const volatile uint32_t* flag, uint32_t value) {
  // Each read crosses PCIe (~1 us); a short sleep between reads keeps the bus quiet.
  while (static_cast<int32_t>(*flag - value) < 0) __nanosleep(200);
}

}  // namespace

void wait_host_flag(const uint32_t* flag, uint32_t value, cudaStream_t stream) {
  wait_host_flag_kernel<<<1, 1, 0, stream>>>(flag, value);
  MOE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace moe::cuda
