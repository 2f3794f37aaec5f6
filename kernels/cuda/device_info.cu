#include <algorithm>
#include <array>
#include <atomic>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_info.h"

namespace moe::cuda {
namespace {

// Compiled like every kernel of the library: the driver picks its code as it picks theirs.
__global__ void arch_probe_kernel() {}

// `query(dev)` for the current device, remembered per device (0 means not yet asked).
template <typename Query>
int per_device(std::array<std::atomic<int>, 64>& cache, Query query) {
  int dev = 0;
  MOE_CUDA_CHECK(cudaGetDevice(&dev));
  const bool cached = dev >= 0 && dev < static_cast<int>(cache.size());
  if (cached) {
    if (const int known = cache[static_cast<size_t>(dev)].load(std::memory_order_relaxed)) {
      return known;
    }
  }
  const int value = query(dev);
  if (cached) cache[static_cast<size_t>(dev)].store(value, std::memory_order_relaxed);
  return value;
}

}  // namespace

int kernel_arch() {
  static std::array<std::atomic<int>, 64> cache{};
  return per_device(cache, [](int) {
    cudaFuncAttributes attr{};
    MOE_CUDA_CHECK(cudaFuncGetAttributes(&attr, arch_probe_kernel));
    return attr.ptxVersion;
  });
}

int sm_count() {
  static std::array<std::atomic<int>, 64> cache{};
  return per_device(cache, [](int dev) {
    int sms = 0;
    MOE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return std::max(sms, 1);
  });
}

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
