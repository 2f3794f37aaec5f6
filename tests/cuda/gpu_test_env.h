// Shared helpers of the CUDA kernel tests: skipping (with the driver's reason) when no GPU is
// usable, host <-> device copies, and the normalized error the tolerances are stated in.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_buffer.h"

namespace moe::test {

// Empty when a CUDA device can be used, else why not (the runtime's message).
inline std::string cuda_unavailable_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // reset the runtime's last-error state
    return cudaGetErrorString(err);
  }
  if (n == 0) return "the driver reports 0 devices";
  return "";
}

template <class T>
cuda::DeviceBuffer to_device(const std::vector<T>& v) {
  cuda::DeviceBuffer b(v.size() * sizeof(T));
  if (!v.empty()) {
    MOE_CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  }
  return b;
}

// Synchronizes (legacy default stream) and copies n values back.
template <class T>
std::vector<T> to_host(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<T> v(n);
  MOE_CUDA_CHECK(cudaDeviceSynchronize());
  if (n > 0) MOE_CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

// ||got - want|| / ||want|| (want computed in double).
inline double normalized_error(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// Runs f and expects a moe::Error whose message contains `part` (so a CUDA failure, also a
// moe::Error, cannot pass for the argument check under test).
inline void expect_error(const std::function<void()>& f, const std::string& part) {
  try {
    f();
    ADD_FAILURE() << "no moe::Error (expected one containing '" << part << "')";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

}  // namespace moe::test

// First statement of every test that launches kernels.
#define MOE_REQUIRE_GPU()                                                                \
  do {                                                                                   \
    const std::string moe_gpu_reason_ = ::moe::test::cuda_unavailable_reason();          \
    if (!moe_gpu_reason_.empty()) GTEST_SKIP() << "no CUDA device: " << moe_gpu_reason_; \
  } while (0)
