#include "coordinator/residency/residency_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "common/error.h"

namespace moe::model {

namespace {

// anchored_ is re-based once the clock is this many half-lives past the anchor, so that a score
// carried to the anchor grows by at most 2^64 (far from overflowing a double).
constexpr double kRebaseHalfLives = 64;

}  // namespace

ResidencyPolicy::ResidencyPolicy(std::vector<bool> cpu_layer, int64_t n_expert, int64_t n_slots,
                                 Grouping g, double half_life_tokens)
    : cpu_layer_(std::move(cpu_layer)),
      n_layer_(static_cast<int64_t>(cpu_layer_.size())),
      n_expert_(n_expert),
      n_slots_(n_slots),
      grouping_(g),
      half_life_(half_life_tokens) {
  if (n_layer_ == 0) throw Error("residency policy: no layers");
  if (n_expert <= 0) {
    throw Error("residency policy: n_expert must be positive, got " + std::to_string(n_expert));
  }
  if (n_expert > std::numeric_limits<int64_t>::max() / n_layer_) {
    throw Error("residency policy: too many experts (" + std::to_string(n_layer_) + " layers x " +
                std::to_string(n_expert) + ")");
  }
  if (n_slots < 0) {
    throw Error("residency policy: n_slots must not be negative, got " + std::to_string(n_slots));
  }
  if (!(half_life_tokens > 0) || !std::isfinite(half_life_tokens)) {
    throw Error("residency policy: the half-life must be a positive number of tokens, got " +
                std::to_string(half_life_tokens));
  }
  const int64_t n_keys = n_layer_ * n_expert_;
  score_.assign(n_keys, 0.0);
  stamp_.assign(n_keys, 0);
  anchored_.assign(n_keys, 0.0);
  slot_of_.assign(n_keys, -1);
  owner_.assign(n_slots_, -1);
  range_.assign(n_layer_, {0, 0});
  pinned_.assign(n_keys, 0);
  pinned_keys_.reserve(n_keys);
  split_evenly();
}

int64_t ResidencyPolicy::key(int64_t layer, int64_t expert) const {
  if (layer < 0 || layer >= n_layer_) {
    throw Error("residency policy: layer " + std::to_string(layer) + " out of range (" +
                std::to_string(n_layer_) + " layers)");
  }
  if (expert < 0 || expert >= n_expert_) {
    throw Error("residency policy: expert " + std::to_string(expert) + " out of range (" +
                std::to_string(n_expert_) + " experts)");
  }
  return layer * n_expert_ + expert;
}

double ResidencyPolicy::effective(int64_t k) const {
  if (score_[k] == 0) return 0;
  return score_[k] * std::exp2(-static_cast<double>(clock_ - stamp_[k]) / half_life_);
}

void ResidencyPolicy::set_score(int64_t k, double s) {
  score_[k] = s;
  stamp_[k] = clock_;
  anchored_[k] = s * std::exp2(static_cast<double>(clock_ - anchor_) / half_life_);
}

void ResidencyPolicy::rebase() {
  anchor_ = clock_;
  for (int64_t k = 0; k < static_cast<int64_t>(score_.size()); ++k) anchored_[k] = effective(k);
}

void ResidencyPolicy::tick(int64_t n_tokens) {
  if (n_tokens < 0) {
    throw Error("residency policy: negative token count " + std::to_string(n_tokens));
  }
  if (n_tokens > std::numeric_limits<int64_t>::max() - clock_) {
    throw Error("residency policy: token clock overflow");
  }
  clock_ += n_tokens;
  if (static_cast<double>(clock_ - anchor_) > kRebaseHalfLives * half_life_) rebase();
}

void ResidencyPolicy::touch(int64_t layer, int64_t expert, double weight) {
  const int64_t k = key(layer, expert);
  if (!(weight > 0) || !std::isfinite(weight)) {
    throw Error("residency policy: routing weight " + std::to_string(weight) +
                " (must be positive and finite)");
  }
  if (!cpu_layer_[layer]) return;
  set_score(k, effective(k) + weight);
}

double ResidencyPolicy::score(int64_t layer, int64_t expert) const {
  return effective(key(layer, expert));
}

void ResidencyPolicy::set_scores(const std::vector<uint64_t>& counts) {
  if (static_cast<int64_t>(counts.size()) != n_layer_ * n_expert_) {
    throw Error("residency policy: " + std::to_string(counts.size()) + " counts for " +
                std::to_string(n_layer_) + " layers x " + std::to_string(n_expert_) + " experts");
  }
  for (int64_t k = 0; k < n_layer_ * n_expert_; ++k) {
    set_score(k, cpu_layer_[k / n_expert_] ? static_cast<double>(counts[k]) : 0.0);
  }
}

int64_t ResidencyPolicy::slot_of(int64_t layer, int64_t expert) const {
  return slot_of_[key(layer, expert)];
}

int64_t ResidencyPolicy::owner(int64_t slot) const {
  if (slot < 0 || slot >= n_slots_) {
    throw Error("residency policy: slot " + std::to_string(slot) + " out of range (" +
                std::to_string(n_slots_) + " slots)");
  }
  return owner_[slot];
}

std::pair<int64_t, int64_t> ResidencyPolicy::range(int64_t layer) const {
  key(layer, 0);  // checks the layer
  if (grouping_ == Grouping::Off) return {0, n_slots_};
  return range_[layer];
}

void ResidencyPolicy::split_evenly() {
  const int64_t n_cpu = std::count(cpu_layer_.begin(), cpu_layer_.end(), true);
  int64_t first = 0, seen = 0;
  for (int64_t l = 0; l < n_layer_; ++l) {
    int64_t count = 0;
    if (cpu_layer_[l]) {
      count = n_slots_ / n_cpu + (seen < n_slots_ % n_cpu ? 1 : 0);
      ++seen;
    }
    range_[l] = {first, count};
    first += count;
  }
}

void ResidencyPolicy::split_by_mass(const std::vector<double>& eff) {
  std::vector<double> mass(n_layer_, 0.0);
  double total = 0;
  for (int64_t l = 0; l < n_layer_; ++l) {
    if (!cpu_layer_[l]) continue;
    for (int64_t e = 0; e < n_expert_; ++e) mass[l] += eff[l * n_expert_ + e];
    total += mass[l];
  }
  if (!(total > 0)) {
    split_evenly();
    return;
  }
  // Shares by mass. A layer whose share reaches n_expert gets n_expert (more slots than experts
  // would stay empty) and the others share the rest; once no share reaches it, largest-remainder
  // rounding of the shares.
  std::vector<int64_t> count(n_layer_, 0);
  std::vector<char> active(n_layer_, 0);
  for (int64_t l = 0; l < n_layer_; ++l) active[l] = cpu_layer_[l] && mass[l] > 0;
  int64_t left = n_slots_;
  std::vector<double> frac(n_layer_, 0.0);
  std::vector<int64_t> order;
  for (;;) {
    double m = 0;
    for (int64_t l = 0; l < n_layer_; ++l) m += active[l] ? mass[l] : 0.0;
    if (!(m > 0) || left == 0) break;
    const double per_mass = static_cast<double>(left) / m;
    bool capped = false;
    int64_t room = left;  // capping never hands out more than is left, whatever the rounding
    for (int64_t l = 0; l < n_layer_; ++l) {
      if (active[l] && per_mass * mass[l] >= static_cast<double>(n_expert_) && room >= n_expert_) {
        count[l] = n_expert_;
        active[l] = 0;
        room -= n_expert_;
        capped = true;
      }
    }
    if (capped) {
      left = room;
      continue;
    }
    order.clear();
    for (int64_t l = 0; l < n_layer_; ++l) {
      if (!active[l]) continue;
      const double share = per_mass * mass[l];
      count[l] = static_cast<int64_t>(std::floor(share));
      frac[l] = share - static_cast<double>(count[l]);
      left -= count[l];
      order.push_back(l);
    }
    // Largest remainder first, ties to the lower layer (the rounding can leave left < 0 only
    // through floating-point error; then the smallest remainders give a slot back).
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return frac[a] > frac[b]; });
    for (auto it = order.begin(); it != order.end() && left > 0; ++it, --left) ++count[*it];
    for (auto it = order.rbegin(); it != order.rend() && left < 0; ++it) {
      if (count[*it] > 0) {
        --count[*it];
        ++left;
      }
    }
    break;
  }
  // Slots nobody's share took (every layer with mass holds n_expert): round robin to the layers
  // with room, lowest first, and when none has room to every CPU-homed layer (they stay empty).
  // total > 0, so there is a CPU-homed layer.
  while (left > 0) {
    bool room = false;
    for (int64_t l = 0; l < n_layer_ && left > 0; ++l) {
      if (cpu_layer_[l] && count[l] < n_expert_) {
        ++count[l];
        --left;
        room = true;
      }
    }
    for (int64_t l = 0; !room && l < n_layer_ && left > 0; ++l) {
      if (cpu_layer_[l]) {
        ++count[l];
        --left;
      }
    }
  }
  int64_t first = 0;
  for (int64_t l = 0; l < n_layer_; ++l) {
    range_[l] = {first, count[l]};
    first += count[l];
  }
}

std::vector<ResidencyPolicy::Assignment> ResidencyPolicy::plan() {
  const int64_t n_keys = n_layer_ * n_expert_;
  std::vector<double> eff(n_keys, 0.0);
  for (int64_t k = 0; k < n_keys; ++k) {
    if (cpu_layer_[k / n_expert_]) eff[k] = effective(k);
  }
  if (grouping_ == Grouping::Layout) split_by_mass(eff);

  // Groups: (first slot, slot count, first key, key count).
  struct Group {
    int64_t first, count, key0, n_keys;
  };
  std::vector<Group> groups;
  if (grouping_ == Grouping::Off) {
    groups.push_back({0, n_slots_, 0, n_keys});
  } else {
    for (int64_t l = 0; l < n_layer_; ++l) {
      if (cpu_layer_[l])
        groups.push_back({range_[l].first, range_[l].second, l * n_expert_, n_expert_});
    }
  }

  std::vector<int64_t> new_owner(n_slots_, -1), new_slot(n_keys, -1);
  std::vector<int64_t> best;
  for (const Group& g : groups) {
    // The group's top keys: score > 0, best first (higher score, then the lower key: lower layer,
    // then lower expert).
    best.clear();
    for (int64_t k = g.key0; k < g.key0 + g.n_keys; ++k) {
      if (eff[k] > 0) best.push_back(k);
    }
    const auto better = [&](int64_t a, int64_t b) {
      return eff[a] > eff[b] || (eff[a] == eff[b] && a < b);
    };
    const int64_t take = std::min<int64_t>(g.count, static_cast<int64_t>(best.size()));
    std::partial_sort(best.begin(), best.begin() + take, best.end(), better);
    best.resize(take);
    // Those resident in the group's slots stay where they are.
    std::vector<char> chosen(g.n_keys, 0);
    for (int64_t k : best) chosen[k - g.key0] = 1;
    for (int64_t s = g.first; s < g.first + g.count; ++s) {
      const int64_t k = owner_[s];
      if (k >= g.key0 && k < g.key0 + g.n_keys && chosen[k - g.key0]) {
        new_owner[s] = k;
        new_slot[k] = s;
      }
    }
    // The others fill the group's free slots, ascending, best first.
    int64_t s = g.first;
    for (int64_t k : best) {
      if (new_slot[k] >= 0) continue;
      while (new_owner[s] >= 0) ++s;
      new_owner[s] = k;
      new_slot[k] = s;
    }
  }

  std::vector<Assignment> changes;
  for (int64_t s = 0; s < n_slots_; ++s) {
    if (new_owner[s] != owner_[s]) changes.push_back({s, new_owner[s]});
  }
  owner_ = std::move(new_owner);
  slot_of_ = std::move(new_slot);
  filled_ = n_slots_ - std::count(owner_.begin(), owner_.end(), int64_t{-1});
  return changes;
}

int64_t ResidencyPolicy::admit(int64_t layer, int64_t expert) {
  const int64_t k = key(layer, expert);
  if (!cpu_layer_[layer]) return -1;
  if (slot_of_[k] >= 0) return slot_of_[k];
  const auto [first, count] = range(layer);
  int64_t victim = -1;
  for (int64_t s = first; s < first + count; ++s) {
    const int64_t o = owner_[s];
    if (o < 0) {  // a free slot: no one is displaced
      owner_[s] = k;
      slot_of_[k] = s;
      ++filled_;
      ++admissions_;
      return s;
    }
    if (pinned_[o]) continue;
    // The coldest goes; on a tie, the one that ranks lower in plan() (the higher key).
    if (victim < 0 || anchored_[o] < anchored_[owner_[victim]] ||
        (anchored_[o] == anchored_[owner_[victim]] && o > owner_[victim])) {
      victim = s;
    }
  }
  if (victim < 0) return -1;  // no slot, or every one pinned
  const int64_t old = owner_[victim];
  if (anchored_[old] >= anchored_[k]) return -1;  // not colder than the newcomer
  slot_of_[old] = -1;
  owner_[victim] = k;
  slot_of_[k] = victim;
  ++evictions_;
  ++admissions_;
  return victim;
}

void ResidencyPolicy::pin(int64_t layer, int64_t expert) {
  const int64_t k = key(layer, expert);
  if (pinned_[k]) return;
  pinned_[k] = 1;
  pinned_keys_.push_back(k);  // at most one entry per key: within the reserved capacity
}

void ResidencyPolicy::reshape(int64_t n_slots, Grouping g) {
  if (n_slots < 0) {
    throw Error("residency policy: n_slots must not be negative, got " + std::to_string(n_slots));
  }
  n_slots_ = n_slots;
  grouping_ = g;
  std::fill(slot_of_.begin(), slot_of_.end(), -1);
  owner_.assign(n_slots_, -1);
  filled_ = 0;
  unpin_all();
  split_evenly();
}

void ResidencyPolicy::unpin_all() {
  for (int64_t k : pinned_keys_) pinned_[k] = 0;
  pinned_keys_.clear();
}

}  // namespace moe::model
