#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"

namespace moe::cuda {

std::vector<DeviceInfo> list_devices() {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  // No GPU or no driver is a normal configuration (CPU-only machine), not an error.
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    cudaGetLastError();
    return {};
  }
  MOE_CUDA_CHECK(err);
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    MOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    MOE_CUDA_CHECK(cudaSetDevice(i));
    size_t free_b = 0, total_b = 0;
    MOE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    out.push_back(
        {i, prop.name, prop.major, prop.minor, prop.multiProcessorCount, total_b, free_b});
  }
  return out;
}

}  // namespace moe::cuda
