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

class Sampler {
 public:
  // Validates params (throws moe::Error). DRY with sequence breakers needs `vocab` to map the
  // breaker strings onto tokens; without it, enabling DRY with breakers throws.
  Sampler(SamplingParams params, int32_t n_vocab, const DryVocab* vocab = nullptr);

  // Picks the next token from one position's logits (size n_vocab). -inf logits are never picked;
  // NaN or +inf logits throw. Does not record the token: call accept() with what is emitted.
  int32_t sample(std::span<const float> logits);

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
  void fill(std::span<const float> logits);
  int32_t draw();

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
};

}  // namespace moe::sampling
