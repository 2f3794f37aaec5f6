// Grouped (MoE expert) products: several weight matrices of the same shape, each applied to its
// own set of activation rows, in one launch.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cuda {

// All groups share type, n_in, n_out, row_bytes; group g's weight matrix starts at w_ptrs[g]
// (device array of device pointers, each aligned as cuda_type_alignment(type) says; a null
// pointer fills the group's rows of y with NaN instead of faulting).
// Rows offsets[g] .. offsets[g+1]-1 (device int32 array of n_groups+1, not decreasing; offsets[0]
// may be above 0, so a range of a larger group list can be passed) belong to group g:
//   y[j * n_out + o] = sum_i W_g[o, i] * x[x_rows[j] * x_stride + i]   for j in that range
// (x_rows: device int32[total_rows], row indices into x; x_stride in floats). Rows of y outside
// every group are not written. Groups with at most 8 rows run as GEMVs (each weight row read once);
// when max_rows_per_group > 8 a tiled kernel reuses every dequantized weight tile for up to 64 of
// the group's rows. max_rows_per_group is an upper bound the host knows (grid sizing only; a
// group with more rows is still computed in full). Empty groups are allowed but cost a little:
// pass only the groups that have rows when that is easy. total_rows = offsets[n_groups] -
// offsets[0]; 0 groups or 0 rows do nothing. Throws moe::Error for invalid arguments.
void grouped_matmul(GgmlType type, int64_t n_in, int64_t n_out, size_t row_bytes,
                    const void* const* w_ptrs, const int32_t* offsets, int32_t n_groups,
                    const int32_t* x_rows, int64_t total_rows, int64_t max_rows_per_group,
                    const float* x, int64_t x_stride, float* y, cudaStream_t stream);

// Whether grouped_gate_up_swiglu() takes these expert weights: Q4_K gate and up, n_in a multiple
// of 256 up to 11264 (the activation row is staged in shared memory).
bool fused_gate_up_supported(GgmlType gate, GgmlType up, int64_t n_in);

// A MoE layer's gate, up and SwiGLU in one launch, made for decode items (groups of one row; more
// rows are walked one by one): for each row j of group g (offsets[g] <= j < offsets[g+1]),
//   h[j * n_out + o] = silu(G_g[o] · x_j) * (U_g[o] · x_j),  x_j = x + x_rows[j] * x_stride,
// silu(v) = v / (1 + exp(-v)), G_g = gate_ptrs[g], U_g = up_ptrs[g] (device arrays of device
// pointers; a null pointer gives NaN rows). The same products as grouped_matmul() on gate and on up
// followed by swiglu(), without the two intermediate arrays and two of the three launches. Both
// matrices share type, n_in, n_out and row_bytes. Throws moe::Error for unsupported or invalid
// arguments.
void grouped_gate_up_swiglu(GgmlType type, int64_t n_in, int64_t n_out, size_t row_bytes,
                            const void* const* gate_ptrs, const void* const* up_ptrs,
                            const int32_t* offsets, int32_t n_items, const int32_t* x_rows,
                            const float* x, int64_t x_stride, float* h, cudaStream_t stream);

}  // namespace moe::cuda
