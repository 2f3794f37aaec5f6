// The candidate list every sampler step transforms: token ids with their logits and (when a step
// needs them) probabilities. Steps shrink it in place; its storage is reused across tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moe::sampling {

struct Candidate {
  int32_t id;
  float logit;
  float p;  // valid only right after softmax()
};

struct Candidates {
  std::vector<Candidate> items;
  // True when items are ordered by descending logit, ties by ascending id (see ranks_before).
  bool sorted = false;

  size_t size() const { return items.size(); }
};

// The total order used everywhere: higher logit first, equal logits by lower token id, so results
// never depend on the sort algorithm.
inline bool ranks_before(const Candidate& a, const Candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Fills p with the softmax of the current logits (computed in double for stable sums).
void softmax(Candidates& c);

// Sorts all candidates with ranks_before (no-op when already sorted).
void sort_desc(Candidates& c);

// Moves the best n candidates, in ranks_before order, to the front; the rest stay behind in
// unspecified order. Cheaper than a full sort when n is small against a 250k vocabulary.
void sort_prefix(Candidates& c, size_t n);

// Index of the best candidate by ranks_before (greedy: ties go to the lowest id). Requires size >
// 0.
size_t argmax(const Candidates& c);

// Keeps only the first n candidates.
void truncate(Candidates& c, size_t n);

}  // namespace moe::sampling
