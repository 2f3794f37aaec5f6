#include "coordinator/sampling/sampler_steps.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

namespace moe::sampling {
namespace {

// Removes candidates failing keep() while preserving order (so a sorted list stays sorted).
template <typename Keep>
void filter(Candidates& c, Keep keep) {
  const auto end =
      std::remove_if(c.items.begin(), c.items.end(), [&](const Candidate& x) { return !keep(x); });
  c.items.erase(end, c.items.end());
}

float max_logit(const Candidates& c) {
  float m = -std::numeric_limits<float>::infinity();
  for (const Candidate& x : c.items) m = std::max(m, x.logit);
  return m;
}

// An upper bound on the nucleus size, in O(size): buckets tokens by logit below the max and
// counts every token down to the bucket where the bucket masses reach p. Saves sorting a
// 250k vocabulary when top_p runs without top_k.
size_t nucleus_bound(const Candidates& c, float p) {
  constexpr size_t kBuckets = 1024;
  if (c.size() <= kBuckets) return 64;
  float lo = c.items[0].logit, hi = lo;
  for (const Candidate& x : c.items) {
    lo = std::min(lo, x.logit);
    hi = std::max(hi, x.logit);
  }
  if (!(hi > lo)) return c.size();
  std::array<double, kBuckets> mass{};
  std::array<size_t, kBuckets> count{};
  const double scale = static_cast<double>(kBuckets - 1) / (static_cast<double>(hi) - lo);
  for (const Candidate& x : c.items) {
    const auto b = static_cast<size_t>((static_cast<double>(hi) - x.logit) * scale);
    mass[b] += x.p;
    ++count[b];
  }
  double cum = 0.0;
  size_t n = 0;
  for (size_t b = 0; b < kBuckets; ++b) {
    cum += mass[b];
    n += count[b];
    if (cum >= p) return n;
  }
  return c.size();
}

}  // namespace

void apply_top_n_sigma(Candidates& c, float n) {
  if (n <= 0.0f || c.size() <= 1) return;
  const float top = max_logit(c);
  double mean = 0.0;
  for (const Candidate& x : c.items) mean += x.logit;
  mean /= static_cast<double>(c.size());
  double var = 0.0;
  for (const Candidate& x : c.items) var += (x.logit - mean) * (x.logit - mean);
  const double sigma = std::sqrt(var / static_cast<double>(c.size()));
  const double cut = top - static_cast<double>(n) * sigma;
  filter(c, [&](const Candidate& x) { return x.logit >= cut; });
}

void apply_top_k(Candidates& c, int32_t k) {
  if (k <= 0 || static_cast<size_t>(k) >= c.size()) return;
  sort_prefix(c, static_cast<size_t>(k));
  truncate(c, static_cast<size_t>(k));
  c.sorted = true;
}

void apply_typical(Candidates& c, float p, size_t min_keep, StepScratch& scratch) {
  if (p >= 1.0f || c.size() <= 1) return;
  softmax(c);
  double entropy = 0.0;
  for (const Candidate& x : c.items) {
    if (x.p > 0.0f) entropy -= static_cast<double>(x.p) * std::log(static_cast<double>(x.p));
  }
  const size_t n = c.size();
  scratch.key.resize(n);
  scratch.index.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float prob = c.items[i].p;
    scratch.key[i] = prob > 0.0f ? static_cast<float>(std::abs(-std::log(prob) - entropy))
                                 : std::numeric_limits<float>::infinity();
    scratch.index[i] = static_cast<uint32_t>(i);
  }
  // Most "typical" first; equal distances by lower id so the result is deterministic.
  std::sort(scratch.index.begin(), scratch.index.end(), [&](uint32_t a, uint32_t b) {
    const float ka = scratch.key[a], kb = scratch.key[b];
    return ka < kb || (ka == kb && c.items[a].id < c.items[b].id);
  });
  size_t keep = n;
  double mass = 0.0;
  for (size_t i = 0; i < n; ++i) {
    mass += c.items[scratch.index[i]].p;
    if (mass > p && i + 1 >= min_keep) {
      keep = i + 1;
      break;
    }
  }
  scratch.items.resize(keep);
  for (size_t i = 0; i < keep; ++i) scratch.items[i] = c.items[scratch.index[i]];
  c.items.resize(keep);
  std::copy(scratch.items.begin(), scratch.items.end(), c.items.begin());
  c.sorted = false;  // now ordered by typicality, not by logit
}

void apply_top_p(Candidates& c, float p, size_t min_keep) {
  if (p >= 1.0f || c.size() <= 1) return;
  softmax(c);
  // Sort only a prefix that surely holds the nucleus (grown if rounding says otherwise).
  size_t sorted_n = std::min(c.size(), std::max(nucleus_bound(c, p), min_keep));
  size_t i = 0;
  double mass = 0.0;
  while (true) {
    sort_prefix(c, sorted_n);
    for (; i < sorted_n; ++i) {
      mass += c.items[i].p;
      if (mass >= p && i + 1 >= min_keep) {
        truncate(c, i + 1);
        c.sorted = true;
        return;
      }
    }
    if (sorted_n == c.size()) return;  // rounding kept the mass below p: keep everything
    sorted_n = std::min(c.size(), sorted_n * 8);
  }
}

void apply_min_p(Candidates& c, float p, size_t min_keep) {
  if (p <= 0.0f || c.items.empty()) return;
  // p_i >= p * p_max  <=>  logit_i >= max_logit + log(p); no softmax needed.
  const float cut = max_logit(c) + std::log(p);
  size_t passing = 0;
  for (const Candidate& x : c.items) passing += x.logit >= cut ? 1 : 0;
  if (passing >= std::max<size_t>(min_keep, 1)) {
    filter(c, [&](const Candidate& x) { return x.logit >= cut; });
    return;
  }
  // Too few pass: the best min_keep tokens (a superset of those passing).
  sort_prefix(c, min_keep);
  truncate(c, min_keep);
  c.sorted = true;
}

void apply_xtc(Candidates& c, float threshold, size_t min_keep) {
  if (c.size() < 2) return;
  softmax(c);
  size_t above = 0;
  for (const Candidate& x : c.items) above += x.p >= threshold ? 1 : 0;
  if (above < 2) return;
  const size_t removed = above - 1;  // all "top choices" but the least likely of them
  if (c.size() - removed < min_keep) return;
  sort_prefix(c, above);
  c.items.erase(c.items.begin(), c.items.begin() + static_cast<std::ptrdiff_t>(removed));
}

void apply_temperature(Candidates& c, float temp) {
  if (c.items.empty()) return;
  if (temp <= 0.0f) {
    c.items[0] = c.items[argmax(c)];
    truncate(c, 1);
    c.sorted = true;
    return;
  }
  for (Candidate& x : c.items) x.logit /= temp;
}

}  // namespace moe::sampling
