// Dense weight × activation products on the GPU: y = x · W^T with W dequantized in registers and
// everything accumulated in float32 (activations are never quantized).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_matrix.h"

namespace moe::cuda {

// y[r * n_out + o] = sum_i W[o, i] * x[r * n_in + i] for r < n_rows (x, y row-major f32 on the
// device). n_rows <= 8 runs a GEMV that reads each weight row once for all rows (4 output rows
// per block of 128 threads); larger batches run a tiled kernel that dequantizes each weight tile
// into shared memory once and reuses it for 64 activation rows. Throws moe::Error for an invalid
// matrix, n_rows < 1 or null pointers. Enqueued on `stream`; does not synchronize.
void matmul(const DeviceMatrix& w, const float* x, int64_t n_rows, float* y, cudaStream_t stream);

}  // namespace moe::cuda
