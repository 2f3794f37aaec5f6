// RMSNorm as ggml computes it: y = x / sqrt(mean(x^2) + eps) * w, the sum of squares in double.
#pragma once

#include <cstdint>

namespace moe::model {

// n_rows rows of n floats (row stride n); y may alias x. w has n gains.
void rmsnorm_rows(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps);

// Gated RMSNorm (qwen35moe's DeltaNet output): y = RMSNorm(x, w) * SiLU(z), row by row; z has the
// same layout as x, y may alias x.
void rmsnorm_gated_rows(const float* x, const float* w, const float* z, float* y, int64_t n_rows,
                        int64_t n, float eps);

}  // namespace moe::model
