// RMSNorm on the GPU, as coordinator/model/rmsnorm.cpp computes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// y = x / sqrt(mean(x^2) + eps) * w for n_rows rows of n floats (row stride n); the sum of squares
// is accumulated in double. y may alias x; w has n gains. Enqueued on `stream`.
void rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps,
             cudaStream_t stream);

}  // namespace moe::cuda
