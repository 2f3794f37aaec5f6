#include "kernels/cpu/rmsnorm.h"

#include <cmath>

#include "kernels/cpu/activations.h"

namespace moe::model {

void rmsnorm_rows(const float* x, const float* w, float* y, int64_t n_rows, int64_t n, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * n;
    float* yr = y + r * n;
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float mean = static_cast<float>(sum / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] * scale * w[i];
  }
}

void rmsnorm_gated_rows(const float* x, const float* w, const float* z, float* y, int64_t n_rows,
                        int64_t n, float eps) {
  rmsnorm_rows(x, w, y, n_rows, n, eps);
  for (int64_t i = 0; i < n_rows * n; ++i) y[i] *= silu(z[i]);
}

}  // namespace moe::model
