// Internal: the one launcher behind matmul() and grouped_matmul(), so that the GEMV and tiled
// kernels of every weight type are compiled once. Arguments are validated by the callers.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cuda::detail {

struct WeightProduct {
  GgmlType type = GgmlType::F32;
  int64_t n_in = 0;
  int64_t n_out = 0;
  size_t row_bytes = 0;
  const void* w = nullptr;              // the matrix when offsets is null
  const void* const* w_ptrs = nullptr;  // device: group g's matrix
  const int32_t* offsets = nullptr;     // device, n_groups + 1; null: one group of n_rows rows
  int32_t n_groups = 1;
  int64_t n_rows = 0;               // rows of the single group when offsets is null
  const int32_t* x_rows = nullptr;  // device: x row of output row j; null: row j itself
  const float* x = nullptr;
  int64_t x_stride = 0;            // floats
  float* y = nullptr;              // row j at y + j * n_out
  int64_t max_rows_per_group = 0;  // <= 8 selects the GEMV kernel
};

// Launches the product on `stream` for p.type (moe::Error for a type without a decoder).
void launch_weight_product(const WeightProduct& p, cudaStream_t stream);

// The same for weight decoder Dec; explicitly instantiated, per type family, in
// matmul_float.cu, matmul_blocks.cu and matmul_kquants.cu.
template <class Dec>
void launch_weight_product_typed(const WeightProduct& p, cudaStream_t stream);

}  // namespace moe::cuda::detail
