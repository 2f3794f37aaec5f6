// What the GPU model tests share: skipping without a device and the expert placements every model
// is checked in. The golden runs and rows they are compared with (run_forced, golden_rows) are
// tests/model/golden_driver.h's, as for the CPU golden tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "coordinator/gpu/gpu_options.h"
#include "coordinator/model/model_arch.h"

namespace moe::test::gpu {

using moe::gpu::GpuOptions;
using namespace moe::model;

inline std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(err);
  if (n == 0) return "no CUDA device";
  return {};
}

struct Placement {
  const char* name;
  bool cpu_moe;
  int64_t n_cpu_moe;
  int64_t resident_mib;
};
inline const Placement kPlacements[] = {
    {"all experts in VRAM", false, 0, 0},
    {"-cmoe, no pool", true, 0, 0},
    {"-ncmoe 2, 1 MiB pool", false, 2, 1},
};

inline GpuOptions options(const Placement& p) {
  GpuOptions o;
  o.n_gpu_layers = 99;
  o.cpu_moe = p.cpu_moe;
  o.n_cpu_moe = p.n_cpu_moe;
  o.moe_resident_mib = p.resident_mib;
  o.n_ctx = 512;
  return o;
}

}  // namespace moe::test::gpu

#define REQUIRE_GPU()                                             \
  do {                                                            \
    const std::string why = ::moe::test::gpu::no_device_reason(); \
    if (!why.empty()) GTEST_SKIP() << why << " (GPU test)";       \
  } while (0)
