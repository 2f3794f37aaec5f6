// The stateless sampler steps, each a transform of the candidate list with llama.cpp's semantics.
// Probability-based steps compute probabilities from the logits as they are at that point in the
// chain (in llama.cpp's default order that is before temperature).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "coordinator/sampling/candidates.h"

namespace moe::sampling {

// Reusable buffers for steps that need more than the list itself (typical_p).
struct StepScratch {
  std::vector<float> key;
  std::vector<uint32_t> index;
  std::vector<Candidate> items;
};

// Keeps tokens whose logit is >= max - n * stddev (population stddev over the candidates).
// n <= 0: off.
void apply_top_n_sigma(Candidates& c, float n);

// Keeps the k highest logits (ties to lower ids). k <= 0: off. Like llama.cpp, min_keep is ignored.
void apply_top_k(Candidates& c, int32_t k);

// Locally typical sampling: ranks tokens by |-log p - entropy| and keeps the smallest prefix whose
// probability mass exceeds p (strictly), and at least min_keep tokens. p >= 1: off.
void apply_typical(Candidates& c, float p, size_t min_keep, StepScratch& scratch);

// Nucleus: keeps the most probable tokens until their mass reaches p (>=), and at least min_keep.
// p >= 1: off.
void apply_top_p(Candidates& c, float p, size_t min_keep);

// Keeps tokens with probability >= p * (max probability), and at least min_keep. p <= 0: off.
void apply_min_p(Candidates& c, float p, size_t min_keep);

// XTC's removal (the caller has already rolled xtc_probability): when two or more tokens have
// probability >= threshold, removes all of them except the least probable one, unless that would
// leave fewer than min_keep tokens.
void apply_xtc(Candidates& c, float threshold, size_t min_keep);

// Divides logits by temp; temp <= 0 keeps only the argmax (ties to the lowest id): greedy.
void apply_temperature(Candidates& c, float temp);

}  // namespace moe::sampling
