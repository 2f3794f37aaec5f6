// Small element-wise and gather/scatter kernels of the forward pass. All pointers are device
// pointers; each call is enqueued on `stream` and does not synchronize. n = 0 does nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_matrix.h"

namespace moe::cuda {

// h[i] = silu(g[i]) * u[i], n elements (silu(v) = v / (1 + exp(-v))). h may alias g or u.
void swiglu(const float* g, const float* u, float* h, int64_t n, cudaStream_t stream);

// x[i] += y[i]. y may also be page-locked host memory (cudaHostAlloc), read through the SMs:
// see host_read.h for why.
void add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream);

// MoE combine, deterministic order: for token t < n_tokens, out[t * n_embd + c] (= if
// !accumulate, += if accumulate) sum over k in [tok_offsets[t], tok_offsets[t+1]) in increasing k
// of weights[k] * y[rows[k] * n_embd + c], the sum starting from 0 and rounded after every product
// and addition (exactly a scalar loop in that order). Tokens with an empty range get 0 (or are
// left unchanged when accumulating).
void combine_rows(const float* y, const int32_t* tok_offsets, const int32_t* rows,
                  const float* weights, int64_t n_tokens, int64_t n_embd, bool accumulate,
                  float* out, cudaStream_t stream);

// out[t * w.n_in + i] = dequantized row ids[t] of w (embedding lookup), t < n (ids device int32),
// bit-identical to kernels/cpu/dequant.cpp. The host validates ids before calling; an id outside
// [0, w.n_out) is never read: its output row is filled with NaN.
void get_rows(const DeviceMatrix& w, const int32_t* ids, int64_t n, float* out,
              cudaStream_t stream);

}  // namespace moe::cuda
