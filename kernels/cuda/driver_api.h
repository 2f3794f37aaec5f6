// CUDA driver functions reached through the runtime's entry-point lookup, so nothing links
// libcuda (the bundle then runs on whatever driver the machine has): stream memory operations,
// virtual memory management. A function the driver lacks is reported, not a crash.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <string>

#include "common/error.h"

namespace moe::cuda {

// The driver's ABI version of the functions looked up (CUDA 12.0: the _v2 memory operations).
inline constexpr unsigned kDriverApiVersion = 12000;

// The driver's `name`, or nullptr with `why` saying what is missing.
template <typename Fn>
Fn driver_function(const char* name, std::string& why) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t rc =
      cudaGetDriverEntryPointByVersion(name, &fn, kDriverApiVersion, cudaEnableDefault, &found);
  if (rc != cudaSuccess || found != cudaDriverEntryPointSuccess || fn == nullptr) {
    why = std::string("the CUDA driver has no ") + name +
          (rc != cudaSuccess ? std::string(" (") + cudaGetErrorString(rc) + ")" : "");
    return nullptr;
  }
  return reinterpret_cast<Fn>(fn);
}

// The driver's `name`; throws moe::Error when it has none.
template <typename Fn>
Fn require_driver_function(const char* name) {
  std::string why;
  Fn fn = driver_function<Fn>(name, why);
  if (!fn) throw Error(why);
  return fn;
}

inline std::string driver_error(const char* what, CUresult rc) {
  return std::string(what) + " failed with CUresult " + std::to_string(static_cast<int>(rc));
}

// Throws moe::Error naming the call when a driver call failed.
inline void check_driver(CUresult rc, const char* what) {
  if (rc != CUDA_SUCCESS) throw Error(driver_error(what, rc));
}

}  // namespace moe::cuda
