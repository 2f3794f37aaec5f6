// MoE router selection on the GPU, as coordinator/model/router.cpp (without forced routing).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace moe::cuda {

// Per token (n_tokens rows of n_expert logits): probs = softmax(logits) (sum in double);
// ids = top k by probability, descending, ties to the lower id; weights = chosen probs / max(sum
// of chosen, 6.1035e-5). probs: [n_tokens, n_expert], ids and weights: [n_tokens, k].
// 1 <= k <= min(32, n_expert), n_expert <= 1024. Enqueued on `stream`.
void router_topk(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, float* probs,
                 int32_t* ids, float* weights, cudaStream_t stream);

}  // namespace moe::cuda
