#include "kernels/cpu/router.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "common/error.h"

namespace moe::model {

namespace {

// probs = softmax(logits) over every expert.
void softmax_all(const float* logits, int64_t n_expert, float* probs) {
  float max = logits[0];
  for (int64_t e = 1; e < n_expert; ++e) max = std::max(max, logits[e]);
  double sum = 0;
  for (int64_t e = 0; e < n_expert; ++e) {
    probs[e] = std::exp(logits[e] - max);
    sum += probs[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < n_expert; ++e) probs[e] *= inv;
}

// ids = `forced` (checked) or the top k of `score` (ties: lower id first).
void select_experts(const float* score, int64_t n_expert, int64_t k, const int32_t* forced,
                    int32_t* ids) {
  if (forced) {
    for (int64_t j = 0; j < k; ++j) {
      if (forced[j] < 0 || forced[j] >= n_expert) {
        throw Error("forced expert id " + std::to_string(forced[j]) + " out of range [0, " +
                    std::to_string(n_expert) + ")");
      }
      ids[j] = forced[j];
    }
  } else {
    // k passes of an arg-max: k and n_expert are small (8 of 128), and ties go to the lower id.
    // Chosen experts are marked a bit each instead of searched for among ids: with the search, a
    // 512-token batch took 1.5 ms to route, on the host thread a GPU prefill waits for.
    constexpr int64_t kMaskWords = 8;  // up to 512 experts; more use the search
    uint64_t taken[kMaskWords] = {};
    const bool masked = n_expert <= 64 * kMaskWords;
    for (int64_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int64_t e = 0; e < n_expert; ++e) {
        const bool chosen = masked ? ((taken[e >> 6] >> (e & 63)) & 1) != 0
                                   : std::find(ids, ids + j, static_cast<int32_t>(e)) != ids + j;
        if (chosen) continue;
        if (best < 0 || score[e] > score[best]) best = static_cast<int32_t>(e);
      }
      ids[j] = best;
      if (masked && best >= 0) taken[best >> 6] |= uint64_t{1} << (best & 63);
    }
  }
}

}  // namespace

void route_token(const float* logits, int64_t n_expert, int64_t k, const int32_t* forced,
                 float* probs, int32_t* ids, float* weights) {
  softmax_all(logits, n_expert, probs);
  select_experts(probs, n_expert, k, forced, ids);
  float wsum = 0;
  for (int64_t j = 0; j < k; ++j) {
    weights[j] = probs[ids[j]];
    wsum += weights[j];
  }
  const float denom = std::max(wsum, 6.103515625e-5f);
  for (int64_t j = 0; j < k; ++j) weights[j] /= denom;
}

void route_token_softmax_weight(const float* logits, int64_t n_expert, int64_t k,
                                const int32_t* forced, float* probs, int32_t* ids, float* weights) {
  softmax_all(logits, n_expert, probs);
  // Selected on the logits themselves: exp can round two close logits to one probability.
  select_experts(logits, n_expert, k, forced, ids);
  float wmax = logits[ids[0]];
  for (int64_t j = 1; j < k; ++j) wmax = std::max(wmax, logits[ids[j]]);
  double wsum = 0;
  for (int64_t j = 0; j < k; ++j) {
    weights[j] = std::exp(logits[ids[j]] - wmax);
    wsum += weights[j];
  }
  const float winv = static_cast<float>(1.0 / wsum);
  for (int64_t j = 0; j < k; ++j) weights[j] *= winv;
}

}  // namespace moe::model
