// RMSNorm on the GPU, as kernels/cpu/rmsnorm.cpp computes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// y = x / sqrt(mean(x^2) + eps) * w for n_rows rows of n floats (row stride n); the sum of squares
// is accumulated in double. y may alias x; w has n gains. Enqueued on `stream`.
void rmsnorm(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps,
             cudaStream_t stream);

// x += delta (written back), then y = rmsnorm(x) as above, in one launch: a residual add and the
// next norm. Neither y nor delta may overlap x.
void add_rmsnorm(float* x, const float* delta, const float* w, float* y, int64_t n_rows, int64_t n,
                 float eps, cudaStream_t stream);

// One token's MoE combine then the next norm, in one launch: x[c] += sum over j < k (increasing)
// of weights[j] * y[j * n + c], rounded as combine_rows (accumulate, one token, rows 0..k-1),
// then out = rmsnorm(x) with gains w. Rows up to combine_rmsnorm_supported(n); out, y and
// weights must not overlap x.
bool combine_rmsnorm_supported(int64_t n);
void combine_rmsnorm(const float* y, const float* weights, int64_t k, float* x, const float* w,
                     float* out, int64_t n, float eps, cudaStream_t stream);

}  // namespace moe::cuda
