// The linear-attention (gated DeltaNet) kernels of qwen35moe on the GPU: the depthwise causal
// conv1d, the L2 norm of q/k heads and the gated delta rule recurrence, as the CPU implementations
// in coordinator/model/ (causal_conv, l2norm, gated_delta_net) compute them. All pointers are
// device pointers; each call is enqueued on `stream` and does not synchronize. Bad shapes, null
// pointers and overlapping buffers throw moe::Error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

struct CausalConvDims {
  int64_t channels = 0;
  int64_t kernel = 0;  // taps, the current token included (1..4096)
};

// As model::causal_conv1d. x: [n_tokens][channels]; w_tap_major: [kernel][channels] (tap kernel-1
// multiplies the current token); state_in: [kernel-1][channels], the previous inputs oldest first,
// or null for zeros. out[t][c] = sum over taps i in increasing order of in(t - kernel + 1 + i)[c] *
// w[i][c] (each product and sum rounded on its own, taps reading a null state skipped), then
// silu(v) = v / (1 + exp(-v)) when `silu`. state_out ([kernel-1][channels]) gets the last kernel-1
// inputs of [state_in, x]; with n_tokens = 0 that is a copy of state_in (zeros when null).
// state_out may be null when kernel = 1. Neither out nor state_out may overlap x, state_in or each
// other.
void causal_conv1d(const CausalConvDims& s, const float* x, int64_t n_tokens,
                   const float* w_tap_major, const float* state_in, float* state_out, float* out,
                   bool silu, cudaStream_t stream);

// In place, as model::l2norm_rows on every head: for token t < n_tokens and head h < n_heads, the
// head_dim floats v at x + t * row_stride + h * head_dim become v * (1 / max(sqrtf(sum), eps)),
// sum = the squares (each rounded to float) accumulated in double. Columns past n_heads * head_dim
// are untouched. n_tokens = 0 does nothing.
void l2norm_heads(float* x, int64_t n_tokens, int64_t row_stride, int64_t n_heads, int64_t head_dim,
                  float eps, cudaStream_t stream);

struct DeltaNetDims {
  int64_t n_k_heads = 0;
  int64_t n_v_heads = 0;  // a multiple of n_k_heads
  int64_t head_k = 0;     // <= 256
  int64_t head_v = 0;
};

// As model::gated_delta_net: per value head h (reading key head h % n_k_heads), state S_h
// [head_v][head_k], and per token t in order:
//   S <- exp(g)·S;  d = beta·(v - S·k);  S <- S + d·k^T;  o = (S·q) / sqrt(head_k)
// with every element of exp(g)·S and S + d·k rounded as the CPU does; the dot products are summed
// in a different order (results agree to float rounding, not bit for bit). q, k: row t at
// q + t * stride (k likewise), n_k_heads heads of head_k; v: row t at v + t * stride, n_v_heads
// heads of head_v; stride >= max(n_k_heads * head_k, n_v_heads * head_v). g (log-decay), beta:
// [n_tokens][n_v_heads]. state_in: [n_v_heads][head_v][head_k] or null for zeros; state_out: the
// state after the last token, same layout. out: [n_tokens][n_v_heads * head_v]. Neither out nor
// state_out may overlap the inputs or each other. n_tokens = 0 does nothing (state_out untouched,
// as the CPU).
void gated_delta_net(const DeltaNetDims& s, const float* q, const float* k, const float* v,
                     int64_t stride, const float* g, const float* beta, int64_t n_tokens,
                     const float* state_in, float* state_out, float* out, cudaStream_t stream);

}  // namespace moe::cuda
