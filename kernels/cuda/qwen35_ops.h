// The small element-wise ops of the qwen35moe forward pass (coordinator/model/qwen35moe.cpp) on
// the GPU, with the CPU's float operations (activations.h: sigmoid(v) = 1 / (1 + exp(-v)),
// silu(v) = v / (1 + exp(-v)), softplus(v) = v > 20 ? v : log(1 + exp(v))). All pointers are
// device pointers; each call is enqueued on `stream` and does not synchronize. Zero elements do
// nothing; bad sizes and null pointers throw moe::Error.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// The DeltaNet gates in place, n_tokens * n_heads values each (index i, head h = i % n_heads):
// beta[i] = sigmoid(beta[i]); g[i] = ssm_a[h] * softplus(g[i] + dt_bias[h]).
void delta_net_gates(float* beta, float* g, const float* dt_bias, const float* ssm_a,
                     int64_t n_tokens, int64_t n_heads, cudaStream_t stream);

// Gated RMSNorm, as model::rmsnorm_gated_rows: for n_rows rows of n floats (row stride n),
// y = (x * (1 / sqrtf(mean + eps)) * w) * silu(z), mean = (float)(sum of x^2 in double / n).
// z has the layout of x; y may alias x.
void rmsnorm_gated(const float* x, const float* w, const float* z, float* y, int64_t n_rows,
                   int64_t n, float eps, cudaStream_t stream);

// attn_q's output rows hold [query head h (head_dim) | gate head h (head_dim)] per head: splits
// qg [n_tokens][n_head * 2 * head_dim] into q and gate, both [n_tokens][n_head * head_dim].
void split_query_gate(const float* qg, float* q, float* gate, int64_t n_tokens, int64_t n_head,
                      int64_t head_dim, cudaStream_t stream);

// x[i] = x[i] * sigmoid(gate[i]), n elements.
void mul_sigmoid(float* x, const float* gate, int64_t n, cudaStream_t stream);

// The shared-expert combine in llama.cpp's order, every operation rounded on its own:
// x[t][d] = (routed[t][d] + shared[t][d] * sigmoid(s[t])) + h[t][d], all [n_tokens][n_embd] but
// s ([n_tokens]). x may alias routed or h.
void shared_expert_combine(const float* routed, const float* shared, const float* s, const float* h,
                           float* x, int64_t n_tokens, int64_t n_embd, cudaStream_t stream);

}  // namespace moe::cuda
