// Dense weight × activation products on the GPU: y = x · W^T. Decode-sized batches dequantize W in
// registers and accumulate in float32; larger batches of quantized weights run on tensor cores
// (int8_products_enabled()).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_matrix.h"

namespace moe::cuda {

// y[r * n_out + o] = sum_i W[o, i] * x[r * n_in + i] for r < n_rows (x, y row-major f32 on the
// device). n_rows <= 8 runs a GEMV that reads each weight row once for all rows (4 output rows
// per block of 128 threads); larger batches run a tiled kernel that decodes each weight tile into
// shared memory once and reuses it for 64 activation rows. Throws moe::Error for an invalid
// matrix, n_rows < 1 or null pointers. Enqueued on `stream`; does not synchronize.
void matmul(const DeviceMatrix& w, const float* x, int64_t n_rows, float* y, cudaStream_t stream);

// Whether products of more than 8 rows with quantized (block-type) weights run on the current
// device's int8 tensor cores, their activations quantized to int8 per 32 values: where the kernels
// run as sm_75 or newer (kernel_arch(); every architecture we build), unless the environment sets
// MOE_CUDA_MMQ=0; then they run on FP16 tensor cores.
// Float weights always keep FP32 arithmetic.
bool int8_products_enabled();

}  // namespace moe::cuda
