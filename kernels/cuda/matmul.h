// Dense weight × activation products on the GPU: y = x · W^T. Decode-sized batches dequantize W in
// registers and accumulate in float32; larger batches of quantized weights run on tensor cores
// (int8_products_enabled()).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <optional>

#include "kernels/cuda/device_matrix.h"

namespace moe::cuda {

// y[r * n_out + o] = sum_i W[o, i] * x[r * n_in + i] for r < n_rows (x, y row-major f32 on the
// device). n_rows <= 8 runs a GEMV that reads each weight row once for all rows (4 output rows
// per block of 128 threads); larger batches run a tiled kernel that decodes each weight tile into
// shared memory once and reuses it for 64 activation rows. Throws moe::Error for an invalid
// matrix, n_rows < 1 or null pointers. Enqueued on `stream`; does not synchronize.
void matmul(const DeviceMatrix& w, const float* x, int64_t n_rows, float* y, cudaStream_t stream);

// Whether products of more than 8 rows with quantized (block-type) weights run on the device's
// int8 tensor cores, their activations quantized to int8 per 32 values (sm_75 or newer code,
// kernel_arch()), instead of FP16 tensor cores. Off unless the environment sets MOE_CUDA_MMQ=1 or
// set_int8_products(true) was called: measured on an H100, the int8 kernel is 1.1-1.5x the FP16
// one on a dense 512-row product, but on experts' row groups at most 7% faster (16-32 rows) and
// 8-25% slower (64-512), and its coarser activations move a batch's logits ~10x as far from the
// GEMV's (docs/performance-log.md, S28).
// Float weights always keep FP32 arithmetic.
bool int8_products_enabled();
// Overrides MOE_CUDA_MMQ for this process (tests, benchmarks); std::nullopt returns to it.
void set_int8_products(std::optional<bool> on);

}  // namespace moe::cuda
