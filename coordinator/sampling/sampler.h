// The sampler chain: applies the steps of SamplingParams::order to the logits of one position and
// draws a token, reproducibly for a given seed.
#pragma once

#include <cstdint>
#include <random>
#include <span>

#include "coordinator/sampling/candidates.h"
#include "coordinator/sampling/dry.h"
#include "coordinator/sampling/penalties.h"
#include "coordinator/sampling/sampler_params.h"
#include "coordinator/sampling/sampler_steps.h"

namespace moe::sampling {

// A token with its natural-log probability.
struct TokenLogprob {
  int32_t id;
  float logprob;
};

// The sampled token's log-probability and the most likely tokens at its position, both in the
// distribution the chain starts from (logits + logit_bias, grammar mask applied).
struct Logprobs {
  TokenLogprob token{};
  std::vector<TokenLogprob> top;  // descending logprob, ties by lower id
};

class Sampler {
 public:
  // Validates params (throws moe::Error). DRY with sequence breakers needs `vocab` to map the
  // breaker strings onto tokens; without it, enabling DRY with breakers throws.
  Sampler(SamplingParams params, int32_t n_vocab, const DryVocab* vocab = nullptr);

  // Picks the next token from one position's logits (size n_vocab). -inf logits are never picked;
  // NaN or +inf logits throw. Does not record the token: call accept() with what is emitted.
  // `allowed`, when not empty, is a bitset over token ids (a grammar's mask: bit i%64 of word
  // i/64); only those tokens can be picked, and none allowed throws.
  int32_t sample(std::span<const float> logits, std::span<const uint64_t> allowed = {});

  // n_top >= 0: every sample() also computes last_logprobs() with the n_top most likely tokens
  // (at most kMaxTopLogprobs); -1 (the default) turns it off.
  static constexpr int kMaxTopLogprobs = 20;
  void set_logprobs(int n_top);
  const Logprobs& last_logprobs() const { return logprobs_; }

  // Records an emitted (or prompt) token for the penalties and DRY.
  void accept(int32_t token);

  // Forgets the history and restarts the random streams from the seed.
  void reset();

  // The seed in use (drawn at construction when params.seed is kRandomSeed).
  uint32_t seed() const { return seed_; }
  const SamplingParams& params() const { return params_; }

  // The candidates left before the final draw of the last sample() call, with probabilities.
  const Candidates& candidates() const { return cands_; }

 private:
  void fill(std::span<const float> logits, std::span<const uint64_t> allowed);
  int32_t draw();
  int32_t run_chain();  // the steps of params_.order, then the draw
  // Before the chain changes the candidates: log-sum-exp and the top tokens.
  void start_logprobs();
  void finish_logprobs(int32_t token, std::span<const float> logits);

  SamplingParams params_;
  int32_t n_vocab_;
  uint32_t seed_;
  size_t min_keep_;
  Penalties penalties_;
  DryPenalty dry_;
  // Separate streams so enabling XTC does not shift the draws of the final sampler.
  std::mt19937_64 rng_;
  std::mt19937_64 xtc_rng_;
  Candidates cands_;
  std::vector<float> bias_;  // logit_bias by token id; empty when there is none
  StepScratch scratch_;
  int n_top_logprobs_ = -1;
  double log_sum_exp_ = 0.0;
  Logprobs logprobs_;
};

}  // namespace moe::sampling
