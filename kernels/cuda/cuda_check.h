// Every CUDA runtime call goes through MOE_CUDA_CHECK: a failure becomes a moe::Error that names
// the call, the file and line and the driver's message, instead of a silent bad state.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "common/error.h"

namespace moe::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file,
                                          int line) {
  throw Error(std::string("CUDA error in ") + what + " at " + file + ":" + std::to_string(line) +
              ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

}  // namespace moe::cuda

#define MOE_CUDA_CHECK(call)                                                   \
  do {                                                                         \
    const cudaError_t moe_cuda_err_ = (call);                                  \
    if (moe_cuda_err_ != cudaSuccess) {                                        \
      ::moe::cuda::throw_cuda_error(moe_cuda_err_, #call, __FILE__, __LINE__); \
    }                                                                          \
  } while (0)
