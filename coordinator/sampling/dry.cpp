#include "coordinator/sampling/dry.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "coordinator/sampling/sampler_params.h"

namespace moe::sampling {
namespace {

constexpr size_t kMaxBreakerBytes = 40;
constexpr size_t kMaxTailTokens = 20;

bool entry_less(const DryBreakers::Entry& a, const DryBreakers::Entry& b) {
  return a.head < b.head || (a.head == b.head && a.tail < b.tail);
}

}  // namespace

DryBreakers DryBreakers::build(const std::vector<std::string>& breakers, int32_t n_vocab,
                               const DryVocab& vocab) {
  DryBreakers out;
  std::vector<std::string> strs;
  for (const std::string& s : breakers) {
    if (!s.empty()) strs.push_back(s.substr(0, kMaxBreakerBytes));
  }
  if (strs.empty()) return out;
  // tails[b][k]: tokenization of breaker b without its first k bytes, made on first use.
  std::vector<std::vector<std::vector<int32_t>>> tails(strs.size());
  std::vector<std::vector<bool>> have_tail(strs.size());
  for (size_t b = 0; b < strs.size(); ++b) {
    tails[b].resize(strs[b].size());
    have_tail[b].assign(strs[b].size(), false);
  }
  for (int32_t t = 0; t < n_vocab; ++t) {
    const std::string piece = vocab.piece(t);
    if (piece.empty()) continue;
    const std::string_view w(piece);
    for (size_t b = 0; b < strs.size(); ++b) {
      const std::string_view s(strs[b]);
      if (w.find(s) != std::string_view::npos) {
        out.add(t, {});
        continue;
      }
      // The token's text ends with the first k bytes of the breaker: the rest must follow.
      for (size_t k = std::min(w.size(), s.size() - 1); k >= 1; --k) {
        if (w.substr(w.size() - k) != s.substr(0, k)) continue;
        if (!have_tail[b][k]) {
          std::vector<int32_t> tail = vocab.tokenize(s.substr(k));
          if (tail.size() > kMaxTailTokens) tail.resize(kMaxTailTokens);
          tails[b][k] = std::move(tail);
          have_tail[b][k] = true;
        }
        if (!tails[b][k].empty()) out.add(t, tails[b][k]);
      }
    }
  }
  return out;
}

void DryBreakers::add(int32_t head, std::vector<int32_t> tail) {
  Entry e{head, std::move(tail)};
  const auto pos = std::lower_bound(entries_.begin(), entries_.end(), e, entry_less);
  if (pos != entries_.end() && pos->head == e.head && pos->tail == e.tail) return;
  entries_.insert(pos, std::move(e));
}

std::span<const DryBreakers::Entry> DryBreakers::starting_with(int32_t head) const {
  const auto lo = std::lower_bound(entries_.begin(), entries_.end(), head,
                                   [](const Entry& e, int32_t h) { return e.head < h; });
  auto hi = lo;
  while (hi != entries_.end() && hi->head == head) ++hi;
  return {lo, hi};
}

bool DryBreakers::is_single_token(int32_t token) const {
  // Entries are sorted by tail within a head, so an empty tail comes first.
  const auto range = starting_with(token);
  return !range.empty() && range.front().tail.empty();
}

DryPenalty::DryPenalty(const SamplingParams& params, int32_t n_vocab, DryBreakers breakers)
    : multiplier_(params.dry_multiplier),
      base_(params.dry_base),
      allowed_length_(params.dry_allowed_length),
      last_n_(params.dry_penalty_last_n),
      breakers_(std::move(breakers)),
      history_(enabled() ? params.dry_penalty_last_n : 0) {
  if (enabled()) max_repeat_.assign(static_cast<size_t>(n_vocab), -1);
}

bool DryPenalty::enabled() const { return multiplier_ > 0.0f && base_ >= 1.0f && last_n_ != 0; }

void DryPenalty::accept(int32_t token) { history_.push(token); }

void DryPenalty::reset() { history_.clear(); }

size_t DryPenalty::repeat_limit(size_t n) const {
  if (breakers_.empty()) return n;
  for (size_t i = 0; i < n; ++i) {
    // The nearest breaker to the end wins; among sequences whose head is there, the longest
    // whose tail matches the tokens after it.
    int64_t longest = -1;
    for (const DryBreakers::Entry& e : breakers_.starting_with(reversed_[i])) {
      const size_t len = e.tail.size();
      if (static_cast<int64_t>(len) <= longest || len > i) continue;
      bool match = true;
      for (size_t o = 0; o < len && match; ++o) match = e.tail[o] == reversed_[i - 1 - o];
      if (match) longest = static_cast<int64_t>(len);
    }
    if (longest >= 0) return i - static_cast<size_t>(longest);
  }
  return n;
}

void DryPenalty::apply(Candidates& c) {
  if (!enabled()) return;
  const size_t n = history_.size();
  const size_t allowed = static_cast<size_t>(allowed_length_);
  if (n <= allowed) return;
  reversed_.resize(n);
  for (size_t i = 0; i < n; ++i) reversed_[i] = history_.from_end(i);
  const size_t limit = repeat_limit(n);
  if (limit < allowed) return;

  // z_[k] = length of the longest common prefix of reversed_ and reversed_[k..], i.e. how many
  // tokens ending k positions before the end equal the tokens ending at the end (linear time).
  z_.assign(n, 0);
  size_t box_l = 0, box_r = 0;  // [box_l, box_r): rightmost known match window
  for (size_t k = 1; k < n; ++k) {
    size_t len = 0;
    if (k < box_r) len = std::min(box_r - k, static_cast<size_t>(z_[k - box_l]));
    while (k + len < n && reversed_[len] == reversed_[k + len]) ++len;
    z_[k] = static_cast<int32_t>(len);
    if (k + len > box_r) {
      box_l = k;
      box_r = k + len;
    }
  }
  // A repeat of the current suffix that ends k tokens back was followed by reversed_[k - 1]:
  // emitting that token again would extend the repeat.
  for (size_t k = 1; k < n; ++k) {
    const size_t len = std::min(static_cast<size_t>(z_[k]), limit);
    if (len < allowed) continue;
    const int32_t next = reversed_[k - 1];
    int32_t& best = max_repeat_[static_cast<size_t>(next)];
    if (best < 0) touched_.push_back(next);
    best = std::max(best, static_cast<int32_t>(len));
  }
  if (touched_.empty()) return;

  // Cap the exponent so base^exponent stays below FLT_MAX (log(FLT_MAX) ~ 88.72).
  int32_t max_exponent = 0;
  if (base_ > 1.000001f) max_exponent = static_cast<int32_t>(88.7228391f / std::log(base_));
  for (Candidate& x : c.items) {
    const int32_t len = max_repeat_[static_cast<size_t>(x.id)];
    if (len < 0 || breakers_.is_single_token(x.id)) continue;
    int32_t exponent = len - allowed_length_;
    if (max_exponent > 0) exponent = std::min(exponent, max_exponent);
    // The exponent cap can still round to FLT_MAX's neighbour; keep the logit finite.
    const double penalty = static_cast<double>(multiplier_) * std::pow(double{base_}, exponent);
    x.logit -= static_cast<float>(std::min(penalty, double{std::numeric_limits<float>::max()}));
  }
  c.sorted = false;
  for (int32_t t : touched_) max_repeat_[static_cast<size_t>(t)] = -1;
  touched_.clear();
}

}  // namespace moe::sampling
