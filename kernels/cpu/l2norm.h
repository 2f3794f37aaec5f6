// L2 normalisation as ggml_l2_norm: y = x / max(||x||, eps), the sum of squares in double.
#pragma once

#include <cstdint>

namespace moe::model {

// n_rows rows of n floats (row stride n), in place.
void l2norm_rows(float* x, int64_t n_rows, int64_t n, float eps);

}  // namespace moe::model
