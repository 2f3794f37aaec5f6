// Small element-wise and gather/scatter kernels of the forward pass. All pointers are device
// pointers; each call is enqueued on `stream` and does not synchronize. n = 0 does nothing.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/device_matrix.h"

namespace moe::cuda {

// h[i] = silu(g[i]) * u[i], n elements (silu(v) = v / (1 + exp(-v))). h may alias g or u.
void swiglu(const float* g, const float* u, float* h, int64_t n, cudaStream_t stream);

// gpt-oss's expert activation with the experts' biases, for n_rows rows of n_ff: row r computes
// expert e = row_expert[r] (device int32), and
//   h[r, c] = swiglu_oai(g[r, c] + gate_bias[e * n_ff + c], u[r, c] + up_bias[e * n_ff + c])
// as kernels/cpu/activations.h (min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u,
// -limit, limit) + 1), accurate expf). Null biases add nothing (row_expert may then be null); an
// expert outside [0, n_expert) gives a NaN row, never a read outside the biases. h may alias g or
// u.
void swiglu_oai(const float* g, const float* u, float* h, int64_t n_rows, int64_t n_ff,
                const int32_t* row_expert, const float* gate_bias, const float* up_bias,
                int64_t n_expert, float alpha, float limit, cudaStream_t stream);

// y[r * row_stride + c] += bias[c] for r < n_rows, c < width (row_stride >= width): a
// projection's bias on every row.
void add_bias(float* y, int64_t n_rows, int64_t width, int64_t row_stride, const float* bias,
              cudaStream_t stream);

// y[r * width + c] += bias[row_expert[r] * width + c]: the down projection's expert bias, row r
// computed by expert row_expert[r] (device int32); one outside [0, n_expert) gives a NaN row.
void add_expert_bias(float* y, int64_t n_rows, int64_t width, const int32_t* row_expert,
                     const float* bias, int64_t n_expert, cudaStream_t stream);

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
