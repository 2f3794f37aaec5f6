// Grouped expert products: argument checks, then the shared GEMV / tiled weight-product kernels
// (matmul.cu) with one grid row per group.
#include <string>

#include "common/error.h"
#include "kernels/cuda/device_matrix.h"
#include "kernels/cuda/expert_matmul.h"
#include "kernels/cuda/weight_product.h"

namespace moe::cuda {

void grouped_matmul(GgmlType type, int64_t n_in, int64_t n_out, size_t row_bytes,
                    const void* const* w_ptrs, const int32_t* offsets, int32_t n_groups,
                    const int32_t* x_rows, int64_t total_rows, int64_t max_rows_per_group,
                    const float* x, int64_t x_stride, float* y, cudaStream_t stream) {
  // Shape and type checks as for one matrix; the data pointer stands in for the group pointers,
  // which live on the device and cannot be checked here.
  DeviceMatrix shape;
  shape.type = type;
  shape.data = w_ptrs;
  shape.n_in = n_in;
  shape.n_out = n_out;
  shape.row_bytes = row_bytes;
  check_device_matrix(shape, "grouped_matmul");
  if (n_groups < 0 || n_groups > 65535) {
    throw Error("grouped_matmul: n_groups " + std::to_string(n_groups) + " outside [0, 65535]");
  }
  if (total_rows < 0 || max_rows_per_group < 0) {
    throw Error("grouped_matmul: negative row count");
  }
  if (n_groups == 0 || total_rows == 0) return;
  if (max_rows_per_group < 1) {
    throw Error("grouped_matmul: max_rows_per_group is 0 but there are " +
                std::to_string(total_rows) + " rows");
  }
  if (!offsets || !x_rows || !x || !y) throw Error("grouped_matmul: null device pointer");
  if (x_stride < n_in) {
    throw Error("grouped_matmul: x_stride " + std::to_string(x_stride) + " < n_in " +
                std::to_string(n_in));
  }
  detail::WeightProduct p;
  p.type = type;
  p.n_in = n_in;
  p.n_out = n_out;
  p.row_bytes = row_bytes;
  p.w_ptrs = w_ptrs;
  p.offsets = offsets;
  p.n_groups = n_groups;
  p.x_rows = x_rows;
  p.x = x;
  p.x_stride = x_stride;
  p.y = y;
  p.max_rows_per_group = max_rows_per_group;
  detail::launch_weight_product(p, stream);
}

}  // namespace moe::cuda
