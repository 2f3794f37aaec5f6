// What every forward does around a MoE layer's router, in one place: route each token of a batch
// (letting the test hooks force experts) and describe the layer to ForwardHooks::observe_layer.
#pragma once

#include <cstdint>
#include <span>

#include "coordinator/model/model_arch.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::model {

// Throws moe::Error for an empty batch or a token id outside [0, n_vocab).
void check_tokens(std::span<const int32_t> tokens, int64_t n_vocab);

// Checks a multi-sequence batch before anything runs: at least one chunk, every chunk's tokens
// (check_tokens) and room in its cache, no cache twice. Returns the batch's token count.
int64_t check_chunks(std::span<const SequenceChunk> chunks, int64_t n_vocab);

// route_token for rows 0..n_tokens-1 of `logits` ([n_tokens, n_expert]); row i is the token at
// position pos0 + i, and hooks->force_experts (when set) may choose its experts instead.
// `forced` is scratch for k ids. probs [n_tokens, n_expert], ids and weights [n_tokens, k].
// With `pool` (idle) and no force_experts hook, the tokens are routed on the pool's threads.
// `gating` SoftmaxWeight routes with route_token_softmax_weight (gpt-oss).
void route_batch(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, int64_t layer,
                 int64_t pos0, const ForwardHooks* hooks, int32_t* forced, float* probs,
                 int32_t* ids, float* weights, cpu::ThreadPool* pool = nullptr,
                 ExpertGating gating = ExpertGating::Softmax);

// The LayerTrace of a routed batch (attn_residual left null).
LayerTrace layer_trace(const ModelConfig& cfg, int64_t layer, int64_t pos0, int64_t n_tokens,
                       const float* logits, const float* probs, const int32_t* ids,
                       const float* weights, const float* l_out);

}  // namespace moe::model
