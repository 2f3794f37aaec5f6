#include "coordinator/sampling/penalties.h"

#include <algorithm>

namespace moe::sampling {

Penalties::Penalties(int32_t last_n, float repeat, float frequency, float presence, int32_t n_vocab)
    : last_n_(last_n),
      repeat_(repeat),
      frequency_(frequency),
      presence_(presence),
      // -1 needs no ring: counts over all history are enough and never have to be decremented.
      window_(last_n > 0 ? last_n : 0),
      counts_(static_cast<size_t>(n_vocab), 0) {}

bool Penalties::enabled() const {
  return last_n_ != 0 && (repeat_ != 1.0f || frequency_ != 0.0f || presence_ != 0.0f);
}

void Penalties::accept(int32_t token) {
  if (last_n_ == 0) return;
  ++counts_[static_cast<size_t>(token)];
  const int32_t evicted = window_.push(token);
  if (evicted != TokenRing::kNone) --counts_[static_cast<size_t>(evicted)];
}

void Penalties::reset() {
  window_.clear();
  std::fill(counts_.begin(), counts_.end(), 0);
}

void Penalties::apply(Candidates& c) const {
  if (!enabled()) return;
  for (Candidate& x : c.items) {
    const int32_t n = counts_[static_cast<size_t>(x.id)];
    if (n == 0) continue;
    x.logit = x.logit > 0.0f ? x.logit / repeat_ : x.logit * repeat_;
    x.logit -= static_cast<float>(n) * frequency_ + presence_;
  }
  c.sorted = false;
}

}  // namespace moe::sampling
