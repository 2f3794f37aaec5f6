#include "coordinator/model/batch_routing.h"

#include <algorithm>
#include <string>

#include "common/error.h"
#include "kernels/cpu/router.h"

namespace moe::model {

void check_tokens(std::span<const int32_t> tokens, int64_t n_vocab) {
  if (tokens.empty()) throw Error("forward: empty batch");
  for (int32_t t : tokens) {
    if (t < 0 || t >= n_vocab) {
      throw Error("token id " + std::to_string(t) + " out of range [0, " + std::to_string(n_vocab) +
                  ")");
    }
  }
}

int64_t check_chunks(std::span<const SequenceChunk> chunks, int64_t n_vocab) {
  if (chunks.empty()) throw Error("forward: a batch of no sequences");
  int64_t n = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const SequenceChunk& c = chunks[i];
    if (c.cache == nullptr) throw Error("forward: sequence " + std::to_string(i) + " has no cache");
    check_tokens(c.tokens, n_vocab);
    c.cache->check_room(static_cast<int64_t>(c.tokens.size()));
    for (size_t j = 0; j < i; ++j) {
      if (chunks[j].cache == c.cache) {
        throw Error("forward: sequences " + std::to_string(j) + " and " + std::to_string(i) +
                    " share one cache");
      }
    }
    n += static_cast<int64_t>(c.tokens.size());
  }
  return n;
}

void route_batch(const float* logits, int64_t n_tokens, int64_t n_expert, int64_t k, int64_t layer,
                 int64_t pos0, const ForwardHooks* hooks, int32_t* forced, float* probs,
                 int32_t* ids, float* weights, cpu::ThreadPool* pool, ExpertGating gating) {
  const bool hooked = hooks && hooks->force_experts;
  const auto route =
      gating == ExpertGating::SoftmaxWeight ? route_token_softmax_weight : route_token;
  // Tokens route independently; a prefill batch's routing is worth spreading over the pool (the
  // hook and its `forced` scratch are for one thread).
  constexpr int64_t kTokensPerTask = 32;
  if (pool && !hooked && pool->size() > 1 && n_tokens >= 2 * kTokensPerTask) {
    pool->parallel_for((n_tokens + kTokensPerTask - 1) / kTokensPerTask, [&](int64_t task, int) {
      const int64_t end = std::min(n_tokens, (task + 1) * kTokensPerTask);
      for (int64_t i = task * kTokensPerTask; i < end; ++i) {
        route(logits + i * n_expert, n_expert, k, nullptr, probs + i * n_expert, ids + i * k,
              weights + i * k);
      }
    });
    return;
  }
  for (int64_t i = 0; i < n_tokens; ++i) {
    const bool force = hooked && hooks->force_experts(layer, pos0 + i, forced);
    route(logits + i * n_expert, n_expert, k, force ? forced : nullptr, probs + i * n_expert,
          ids + i * k, weights + i * k);
  }
}

LayerTrace layer_trace(const ModelConfig& cfg, int64_t layer, int64_t pos0, int64_t n_tokens,
                       const float* logits, const float* probs, const int32_t* ids,
                       const float* weights, const float* l_out) {
  LayerTrace tr;
  tr.layer = layer;
  tr.pos0 = pos0;
  tr.n_tokens = n_tokens;
  tr.n_expert = cfg.n_expert;
  tr.n_expert_used = cfg.n_expert_used;
  tr.n_embd = cfg.n_embd;
  tr.router_logits = logits;
  tr.router_probs = probs;
  tr.experts = ids;
  tr.weights = weights;
  tr.l_out = l_out;
  return tr;
}

}  // namespace moe::model
