// Rotary position embedding (NEOX layout) on the GPU, as kernels/cpu/rope.cpp computes it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// NEOX RoPE in place: row t (token at position pos0 + t) holds n_head heads of head_dim floats
// from column 0 of the row; within each head dim i (< n_rot/2) pairs with i + n_rot/2, angle
// theta_i = pos * theta_scale^i with theta_scale = powf(freq_base, -2/n_rot) computed on the host
// and the power built by repeated float multiplication, exactly as rope.cpp; dims >= n_rot are
// untouched. x is [n_tokens, row_stride] floats. Enqueued on `stream`.
void rope_neox(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_head, int64_t head_dim,
               int64_t n_rot, int64_t pos0, float freq_base, cudaStream_t stream);

}  // namespace moe::cuda
