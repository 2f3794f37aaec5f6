// llama.cpp's "penalties" sampler: repetition, presence and frequency penalties over the last
// repeat_last_n accepted tokens.
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/sampling/candidates.h"
#include "coordinator/sampling/token_ring.h"

namespace moe::sampling {

class Penalties {
 public:
  // last_n: window size (0: off, -1: every token since reset). Token ids must be < n_vocab.
  Penalties(int32_t last_n, float repeat, float frequency, float presence, int32_t n_vocab);

  // False when the step cannot change any logit (llama.cpp's early exit).
  bool enabled() const;

  void accept(int32_t token);
  void reset();

  // For each candidate seen c > 0 times in the window: logit /= repeat when positive (*= when
  // not), then logit -= c * frequency + presence.
  void apply(Candidates& c) const;

  int32_t count(int32_t token) const { return counts_[static_cast<size_t>(token)]; }

 private:
  int32_t last_n_;
  float repeat_, frequency_, presence_;
  TokenRing window_;
  std::vector<int32_t> counts_;  // occurrences in the window, by token id
};

}  // namespace moe::sampling
