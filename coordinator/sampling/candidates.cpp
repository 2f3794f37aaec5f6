#include "coordinator/sampling/candidates.h"

#include <algorithm>
#include <cmath>

namespace moe::sampling {

void softmax(Candidates& c) {
  if (c.items.empty()) return;
  float max_logit = c.items[0].logit;
  for (const Candidate& x : c.items) max_logit = std::max(max_logit, x.logit);
  double sum = 0.0;
  for (Candidate& x : c.items) {
    const double e = std::exp(static_cast<double>(x.logit) - max_logit);
    x.p = static_cast<float>(e);
    sum += e;
  }
  for (Candidate& x : c.items) x.p = static_cast<float>(x.p / sum);
}

void sort_desc(Candidates& c) {
  if (c.sorted) return;
  std::sort(c.items.begin(), c.items.end(), ranks_before);
  c.sorted = true;
}

void sort_prefix(Candidates& c, size_t n) {
  if (c.sorted) return;
  if (n >= c.items.size()) {
    sort_desc(c);
    return;
  }
  // ranks_before is a strict total order, so the prefix is the same whatever the algorithm.
  // A heap is fastest for small n (top_k 40); for large n (a wide top_p nucleus) selection plus
  // a sort of the prefix, O(size + n log n), beats the heap's O(size log n).
  const auto mid = c.items.begin() + static_cast<std::ptrdiff_t>(n);
  if (n <= 1024) {
    std::partial_sort(c.items.begin(), mid, c.items.end(), ranks_before);
  } else {
    std::nth_element(c.items.begin(), mid, c.items.end(), ranks_before);
    std::sort(c.items.begin(), mid, ranks_before);
  }
}

size_t argmax(const Candidates& c) {
  size_t best = 0;
  for (size_t i = 1; i < c.items.size(); ++i) {
    if (ranks_before(c.items[i], c.items[best])) best = i;
  }
  return best;
}

void truncate(Candidates& c, size_t n) {
  if (n < c.items.size()) c.items.resize(n);
}

}  // namespace moe::sampling
