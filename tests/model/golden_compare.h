// Comparing our forward with llama.cpp's goldens: logit differences and expert-set agreement,
// shared by the qwen3moe, qwen35moe and GPU golden tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

namespace moe::test {

// Max, RMS and relative RMS of a - b over everything added.
struct Diff {
  double max = 0, sumsq = 0, refsq = 0;
  int64_t n = 0;
  void add(const float* a, const float* b, int64_t m) {
    for (int64_t i = 0; i < m; ++i) {
      const double d = static_cast<double>(a[i]) - b[i];
      max = std::max(max, std::fabs(d));
      sumsq += d * d;
      refsq += static_cast<double>(b[i]) * b[i];
    }
    n += m;
  }
  double rms() const { return n ? std::sqrt(sumsq / static_cast<double>(n)) : 0; }
  double rel() const { return refsq > 0 ? std::sqrt(sumsq / refsq) : 0; }
};

// One (layer, position): the experts chosen (or that the router would have chosen) and the
// router's probabilities.
struct Choice {
  std::vector<int32_t> ids;
  std::vector<float> probs;
};

// The router's own top k (descending probability, ties to the lower id).
inline std::vector<int32_t> own_topk(const float* probs, int64_t n_expert, int64_t k) {
  std::vector<int32_t> order(static_cast<size_t>(n_expert));
  for (int64_t e = 0; e < n_expert; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  order.resize(static_cast<size_t>(k));
  return order;
}

// Largest probability gap between the experts only we chose and those only the golden run chose
// (paired in descending order); 0 when the sets are equal.
inline double set_gap(const Choice& c, const int32_t* golden, int64_t k) {
  std::vector<int32_t> ours(c.ids), gold(golden, golden + k), only_o, only_g;
  std::sort(ours.begin(), ours.end());
  std::sort(gold.begin(), gold.end());
  std::set_difference(ours.begin(), ours.end(), gold.begin(), gold.end(),
                      std::back_inserter(only_o));
  std::set_difference(gold.begin(), gold.end(), ours.begin(), ours.end(),
                      std::back_inserter(only_g));
  const auto by_prob = [&](int32_t a, int32_t b) { return c.probs[a] > c.probs[b]; };
  std::sort(only_o.begin(), only_o.end(), by_prob);
  std::sort(only_g.begin(), only_g.end(), by_prob);
  double gap = 0;
  for (size_t i = 0; i < only_o.size(); ++i) {
    gap = std::max(gap, std::fabs(static_cast<double>(c.probs[only_o[i]]) - c.probs[only_g[i]]));
  }
  return gap;
}

inline bool same_set(const std::vector<int32_t>& ids, const int32_t* golden, int64_t k) {
  std::vector<int32_t> a(ids), b(golden, golden + k);
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return a == b;
}

}  // namespace moe::test
