// How many of a decode layer's m CPU-homed misses to copy over PCIe and compute on the GPU (q)
// while the CPU computes the other m - q. From two measured rates, refined online as moving
// averages: the CPU's time per expert (the runner's job time / its items) and the PCIe copy time
// per expert (device events around the copies). The CPU's part takes t_cpu * (m - q), the copies
// t_pcie * q; both run at once, so the visit is shortest where they meet:
//   q = m * t_cpu / (t_cpu + t_pcie)   (FreeToken's q = m * B_pcie / (B_pcie + B_cpu)).
// Until both rates are measured, q = m / 2 (at least 1, at most m - 1) so that both are; after
// that, every kExploreEvery-th visit with m >= 2 leaves at least one miss to each side, so a rate
// the rule stopped using (e.g. a cold first CPU sample that said "copy everything") is measured
// again. The first kWarmup samples of each rate are dropped, and a sample counts at most 4x the
// average. Trying
// every q and keeping the fastest (the fork's profiler) was tried first: one visit's latency
// varies more between visits than between neighbouring q, so it chose noise (52.7 tok/s against
// 70.4 for a fixed share, docs/performance-log.md). Host-only, no CUDA.
#pragma once

#include <cstdint>
#include <string>

namespace moe::model {

class MissSplitProfiler {
 public:
  // Old: at least one miss is copied per visit (the fork's default; it also keeps the PCIe rate
  // fresh); New: none when the rates say the CPU alone is faster.
  enum class Mode { Old, New };

  // q never exceeds max_q (the caller's staging slots).
  MissSplitProfiler(Mode mode, int max_q);

  static constexpr int kExploreEvery = 16;
  static constexpr int kWarmup = 2;

  // q for a visit with m misses (0 when m is 0).
  int choose(int m);
  // Measurements: the CPU computed `items` expert items in `us`; `experts` were copied in `us`.
  // Non-positive counts and negative or non-finite times are ignored.
  void record_cpu(int64_t items, double us);
  void record_pcie(int64_t experts, double us);
  // Starts from rates measured before the first visit (the machine's calibration) instead of
  // m / 2 and a warm-up: later samples refine them. Non-positive or non-finite rates are ignored.
  void seed(double cpu_us_per_expert, double pcie_us_per_expert);

  bool calibrated() const { return cpu_us_ > 0 && pcie_us_ > 0; }
  double cpu_us_per_expert() const { return cpu_us_; }
  double pcie_us_per_expert() const { return pcie_us_; }
  // e.g. "split from measured rates: CPU 28.1 us/expert, PCIe 49.8 us/expert, 8 misses -> 3
  // copied (old)".
  std::string summary() const;
  Mode mode() const { return mode_; }

 private:
  int rule(int m) const;
  static void update(double& avg, int& seen, double sample);

  Mode mode_;
  int max_q_;
  double cpu_us_ = 0, pcie_us_ = 0;  // 0: not measured yet
  int cpu_seen_ = 0, pcie_seen_ = 0;
  int64_t visits_ = 0;
};

}  // namespace moe::model
