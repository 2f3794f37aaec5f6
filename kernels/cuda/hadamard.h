// The normalized Walsh-Hadamard rotation of quantized KV caches on the GPU, as
// kernels/cpu/hadamard.cpp computes it (Sylvester order, the same butterfly passes and scale).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// In place: row t is x + t * row_stride; its first n values are rotated in consecutive blocks of
// `block` (a power of two, 1..1024, dividing n). Throws moe::Error on bad shapes. Enqueued on
// `stream`; may be captured in a CUDA graph.
void hadamard_rows(float* x, int64_t n_rows, int64_t row_stride, int64_t n, int64_t block,
                   cudaStream_t stream);

}  // namespace moe::cuda
