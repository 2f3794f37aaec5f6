// MoE router selection (qwen3moe / build_moe_ffn with softmax gating and norm_w): probabilities =
// softmax over the router logits, the top k by probability (ties: lower id first), weights = the
// chosen probabilities divided by max(their sum, 6.1035e-5).
#pragma once

#include <cstdint>

namespace moe::model {

// probs: n_expert outputs. ids/weights: k outputs, descending probability. When `forced` is not
// null its k ids are used instead of the top k (their own probabilities, renormalized); an id out
// of range throws moe::Error.
void route_token(const float* logits, int64_t n_expert, int64_t k, const int32_t* forced,
                 float* probs, int32_t* ids, float* weights);

// gpt-oss (llama.cpp's SOFTMAX_WEIGHT gating): the top k by logit (ties: lower id first), weights
// = softmax over the k chosen logits only. probs (for traces) is still the softmax over all
// logits, whose order is the logits'. `forced` as in route_token.
void route_token_softmax_weight(const float* logits, int64_t n_expert, int64_t k,
                                const int32_t* forced, float* probs, int32_t* ids, float* weights);

}  // namespace moe::model
