#include "coordinator/residency/miss_split_profiler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "common/error.h"

namespace moe::model {

MissSplitProfiler::MissSplitProfiler(Mode mode, int max_q) : mode_(mode), max_q_(max_q) {
  if (max_q < 1) throw Error("miss split profiler: max_q must be positive");
}

int MissSplitProfiler::rule(int m) const {
  if (m <= 0) return 0;
  int q;
  if (!calibrated()) {
    // Copy about half so both rates get measured (m = 1: the CPU's rate comes from other visits).
    q = std::clamp((m + 1) / 2, 1, std::max(1, m - 1));
  } else {
    q = static_cast<int>(std::lround(m * cpu_us_ / (cpu_us_ + pcie_us_)));
    if (mode_ == Mode::Old) q = std::max(q, 1);
  }
  return std::min({q, m, max_q_});
}

int MissSplitProfiler::choose(int m) {
  if (m <= 0) return 0;
  int q = rule(m);
  if (m >= 2 && ++visits_ % kExploreEvery == 0) q = std::clamp(q, 1, std::min(m - 1, max_q_));
  return q;
}

void MissSplitProfiler::update(double& avg, int& seen, double sample) {
  if (++seen <= kWarmup) return;  // cold caches, sleeping threads: not the steady rate
  if (avg <= 0) {
    avg = sample;
    return;
  }
  // New samples weigh 1/8 (one visit's time varies by tens of percent), outliers at most 4x.
  avg += (std::min(sample, 4 * avg) - avg) / 8;
}

void MissSplitProfiler::record_cpu(int64_t items, double us) {
  if (items > 0 && std::isfinite(us) && us > 0) {
    update(cpu_us_, cpu_seen_, us / static_cast<double>(items));
  }
}

void MissSplitProfiler::record_pcie(int64_t experts, double us) {
  if (experts > 0 && std::isfinite(us) && us > 0) {
    update(pcie_us_, pcie_seen_, us / static_cast<double>(experts));
  }
}

void MissSplitProfiler::seed(double cpu_us, double pcie_us) {
  const auto ok = [](double v) { return std::isfinite(v) && v > 0; };
  if (!ok(cpu_us) || !ok(pcie_us)) return;
  cpu_us_ = cpu_us;
  pcie_us_ = pcie_us;
  cpu_seen_ = pcie_seen_ = kWarmup;  // the measured start replaces the warm-up
}

std::string MissSplitProfiler::summary() const {
  const char* mode = mode_ == Mode::Old ? "old" : "new";
  char b[160];
  if (!calibrated()) {
    std::snprintf(b, sizeof b, "split from measured rates (%s): not measured yet", mode);
  } else {
    std::snprintf(b, sizeof b,
                  "split from measured rates (%s): CPU %.1f us/expert, PCIe %.1f us/expert, "
                  "8 misses -> %d copied",
                  mode, cpu_us_, pcie_us_, rule(8));
  }
  return b;
}

}  // namespace moe::model
