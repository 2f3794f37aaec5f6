#include "kernels/cpu/l2norm.h"

#include <algorithm>
#include <cmath>

namespace moe::model {

void l2norm_rows(float* x, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* xr = x + r * n;
    double sum = 0;
    // Products in float, accumulated in double, then sqrtf: ggml's exact sequence.
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i] * xr[i]);
    const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(sum)), eps);
    for (int64_t i = 0; i < n; ++i) xr[i] *= scale;
  }
}

}  // namespace moe::model
