#include "kernels/cpu/weight_prefetch.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "common/error.h"

namespace moe::cpu {

namespace detail {
// Constant-initialised, so kernels called before any tuning (or from static initialisers) read
// the default.
std::atomic<uintptr_t> weight_prefetch_ahead{kDefaultPrefetchAhead};
}  // namespace detail

PrefetchTuner::PrefetchTuner(std::vector<uintptr_t> candidates, int samples)
    : candidates_(std::move(candidates)), samples_(samples), rates_(candidates_.size()) {
  if (candidates_.empty() || samples_ < 1) {
    throw Error("PrefetchTuner: needs candidates and at least one sample each");
  }
}

int PrefetchTuner::next() {
  if (decided()) return -1;
  std::lock_guard lock(mu_);
  const auto c = static_cast<int>(turn_ % candidates_.size());
  ++turn_;
  return c;
}

double PrefetchTuner::median_rate(size_t c) const {
  std::vector<double> v = rates_[c];
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void PrefetchTuner::record(int c, double bytes_per_s) {
  if (c < 0 || static_cast<size_t>(c) >= candidates_.size() || !(bytes_per_s > 0)) return;
  std::lock_guard lock(mu_);
  if (decided()) return;
  rates_[static_cast<size_t>(c)].push_back(bytes_per_s);
  for (const auto& r : rates_) {
    if (static_cast<int>(r.size()) < samples_) return;
  }
  int best = 0;
  double best_rate = median_rate(0);
  for (size_t i = 1; i < candidates_.size(); ++i) {
    const double r = median_rate(i);
    if (r > best_rate) {
      best = static_cast<int>(i);
      best_rate = r;
    }
  }
  chosen_ = best;
  decided_.store(true, std::memory_order_release);
}

uintptr_t PrefetchTuner::chosen() const {
  std::lock_guard lock(mu_);
  return candidates_[static_cast<size_t>(chosen_)];
}

std::string PrefetchTuner::summary() const {
  std::lock_guard lock(mu_);
  char buf[96];
  if (!decided()) {
    size_t have = 0;
    for (const auto& r : rates_) have += r.size();
    std::snprintf(buf, sizeof buf, "%zu bytes (default; %zu of %zu timed GEMVs so far)",
                  static_cast<size_t>(candidates_[0]), have,
                  candidates_.size() * static_cast<size_t>(samples_));
    return buf;
  }
  const auto c = static_cast<size_t>(chosen_);
  std::snprintf(buf, sizeof buf, "%zu bytes, measured (%.1f GB/s",
                static_cast<size_t>(candidates_[c]), median_rate(c) / 1e9);
  std::string s = buf;
  for (size_t i = 0; i < candidates_.size(); ++i) {
    if (i == c) continue;
    std::snprintf(buf, sizeof buf, "; %zu: %.1f GB/s", static_cast<size_t>(candidates_[i]),
                  median_rate(i) / 1e9);
    s += buf;
  }
  return s + ")";
}

namespace {

// The default first (kept on ties), then the distance the development Xeon VM needed. 16 timed
// calls each: a 30% difference shows through the first calls' page faults.
struct ProcessTuning {
  PrefetchTuner tuner{{kDefaultPrefetchAhead, 2048}, 16};
  uintptr_t fixed = 0;  // MOE_PREFETCH_AHEAD, or 0

  ProcessTuning() {
    if (const char* env = std::getenv("MOE_PREFETCH_AHEAD")) {
      char* end = nullptr;
      const unsigned long v = std::strtoul(env, &end, 10);
      if (end != env && *end == '\0' && v >= 64 && v <= 65536) {
        fixed = v;
        detail::weight_prefetch_ahead.store(v, std::memory_order_relaxed);
      } else {
        std::fprintf(stderr, "moe: MOE_PREFETCH_AHEAD=%s ignored (bytes from 64 to 65536)\n", env);
      }
    }
  }
};

ProcessTuning& process_tuning() {
  static ProcessTuning t;
  return t;
}

}  // namespace

PrefetchTrial begin_prefetch_trial(size_t weight_bytes) {
  ProcessTuning& p = process_tuning();
  if (p.fixed != 0 || weight_bytes < kPrefetchTrialMinBytes) return {};
  const int c = p.tuner.next();
  if (c < 0) return {};
  detail::weight_prefetch_ahead.store(p.tuner.candidate(c), std::memory_order_relaxed);
  return {c};
}

void end_prefetch_trial(PrefetchTrial t, size_t weight_bytes, double seconds) {
  if (t.candidate < 0 || !(seconds > 0)) return;
  ProcessTuning& p = process_tuning();
  p.tuner.record(t.candidate, static_cast<double>(weight_bytes) / seconds);
  if (p.tuner.decided()) {
    detail::weight_prefetch_ahead.store(p.tuner.chosen(), std::memory_order_relaxed);
  }
}

bool prefetch_tuned() {
  ProcessTuning& p = process_tuning();
  return p.fixed != 0 || p.tuner.decided();
}

std::string prefetch_summary() {
  ProcessTuning& p = process_tuning();
  if (p.fixed != 0) return std::to_string(p.fixed) + " bytes (MOE_PREFETCH_AHEAD)";
  return p.tuner.summary();
}

}  // namespace moe::cpu
