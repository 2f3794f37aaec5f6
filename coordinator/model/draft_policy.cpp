#include "coordinator/model/draft_policy.h"

#include <algorithm>
#include <cmath>

namespace moe::model {
namespace {

// Older observations fade (per drafted token checked, per step timed) so that a change of text or
// of the machine's load shows within tens of steps.
constexpr double kDecay = 0.97;

}  // namespace

DraftPolicy::DraftPolicy(int draft_max) : draft_max_(std::clamp(draft_max, 0, kMaxDraft)) {}

double DraftPolicy::acceptance() const {
  // A uniform prior (one success, one failure) until the counts speak.
  return (stood_ + 1.0) / (checked_ + 2.0);
}

void DraftPolicy::observe_drafts(int drafted, int accepted) {
  if (drafted <= 0) return;
  accepted = std::clamp(accepted, 0, drafted);
  // The tokens that stood, plus the one that did not (if any): trials of the same p.
  const int trials = accepted + (accepted < drafted ? 1 : 0);
  // Decayed per trial, so a streak of long accepted drafts does not outweigh what follows.
  const double fade = std::pow(kDecay, trials);
  stood_ = stood_ * fade + accepted;
  checked_ = checked_ * fade + trials;
}

void DraftPolicy::observe_step(int n, double seconds) {
  if (n < 1 || n > kMaxDraft + 1 || !(seconds >= 0.0) || !std::isfinite(seconds)) return;
  const auto i = static_cast<size_t>(n);
  for (size_t j = 1; j < weight_.size(); ++j) weight_[j] *= kDecay;
  mean_[i] = (mean_[i] * weight_[i] + seconds) / (weight_[i] + 1.0);
  weight_[i] += 1.0;
}

double DraftPolicy::step_seconds(int n) const {
  const auto i = static_cast<size_t>(std::clamp(n, 1, kMaxDraft + 1));
  if (weight_[i] > 0.0) return mean_[i];
  // The weighted least-squares line t = a + b (n - 1) through the measured sizes.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  int sizes = 0;
  for (size_t j = 1; j < weight_.size(); ++j) {
    if (weight_[j] <= 0.0) continue;
    const double w = weight_[j], x = static_cast<double>(j) - 1.0, y = mean_[j];
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
    ++sizes;
  }
  if (sizes == 0) return 0.0;
  const double t1 = weight_[1] > 0.0 ? mean_[1] : sy / sw;
  if (sizes == 1) return i == 2 ? t1 : t1 * static_cast<double>(i);  // try 2, assume the worst
  const double den = sw * sxx - sx * sx;
  const double b = den > 0.0 ? std::max(0.0, (sw * sxy - sx * sy) / den) : 0.0;
  const double a = (sy - b * sx) / sw;
  return std::max(a + b * (static_cast<double>(i) - 1.0), 0.0);
}

double DraftPolicy::expected_tokens(int k) const {
  const double p = acceptance();
  double e = 0.0, pi = 1.0;
  for (int i = 0; i <= k; ++i, pi *= p) e += pi;
  return e;
}

int DraftPolicy::length(int available) const {
  const int k_max = std::clamp(available, 0, draft_max_);
  const double t1 = step_seconds(1);
  if (k_max == 0 || t1 <= 0.0) return 0;  // nothing to draft, or no single step measured yet
  int best = 0;
  double best_rate = expected_tokens(0) / t1;
  for (int k = 1; k <= k_max; ++k) {
    const double t = step_seconds(k + 1);
    if (t <= 0.0) continue;
    const double rate = expected_tokens(k) / t;
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

}  // namespace moe::model
