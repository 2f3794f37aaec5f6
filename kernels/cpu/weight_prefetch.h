// How far ahead of their read position the GEMV kernels software-prefetch the weights, and how
// that distance is chosen: from the machine's own GEMVs, timed as they run.
//
// Why a measurement: a one-row GEMV does so much arithmetic per cache line that the out-of-order
// window alone keeps too few DRAM reads in flight, and the distance that keeps enough in flight
// differs between machines in ways no CPUID field predicts. Measured (docs/performance-log.md): a
// Zen 5 VM needed 6 KiB; the H200 host's Xeon runs Q4_K-Q8_0 at 90-100% of its read bandwidth
// with 6 KiB and 80-87% with 2 KiB; a development Xeon VM runs Q6_K and Q8_0 at 66% with 6 KiB and
// 95-100% with 2 KiB. So the first large GEMVs of a process alternate between the candidates, and
// the faster one (median weight bytes per second) is kept for the rest of the process.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace moe::cpu {

// The distance before (or without) a measurement: measured best on the Zen 5 VM and the H200 host.
inline constexpr uintptr_t kDefaultPrefetchAhead = 6144;

namespace detail {
extern std::atomic<uintptr_t> weight_prefetch_ahead;
}  // namespace detail

// The distance in bytes, read by every GEMV kernel once per weight row. Any value is correct;
// only speed depends on it.
inline uintptr_t weight_prefetch_ahead() {
  return detail::weight_prefetch_ahead.load(std::memory_order_relaxed);
}

// The choice between candidate distances from timed calls, alone (tested on its own; the
// process-wide instance below drives the kernels). Thread-safe.
class PrefetchTuner {
 public:
  // candidates[0] is the default, kept on ties; each candidate is timed `samples` times.
  PrefetchTuner(std::vector<uintptr_t> candidates, int samples);

  // The candidate the next timed call uses (round robin), or -1 once decided.
  int next();
  // Records a timed call of candidate c; decides once every candidate has its samples.
  void record(int c, double bytes_per_s);

  bool decided() const { return decided_.load(std::memory_order_acquire); }
  // The chosen distance (candidates[0] until decided).
  uintptr_t chosen() const;
  uintptr_t candidate(int c) const { return candidates_[static_cast<size_t>(c)]; }
  // "2048 bytes (27.1 GB/s; 6144: 19.2 GB/s)", or what is still being measured.
  std::string summary() const;

 private:
  double median_rate(size_t c) const;  // callers hold mu_

  const std::vector<uintptr_t> candidates_;
  const int samples_;
  mutable std::mutex mu_;
  std::vector<std::vector<double>> rates_;
  size_t turn_ = 0;
  int chosen_ = 0;
  std::atomic<bool> decided_{false};
};

// The process-wide tuning that the GEMV callers (matmul.cpp) feed. A call that moves at least
// kPrefetchTrialMinBytes of weights is a trial while the distance is undecided: begin sets the
// distance for it, end records its rate. MOE_PREFETCH_AHEAD=BYTES (64 to 65536) fixes the
// distance instead. Concurrent trials from several threads are allowed (they only blur the
// measurement).
inline constexpr size_t kPrefetchTrialMinBytes = size_t{4} << 20;

struct PrefetchTrial {
  int candidate = -1;  // -1: not a trial
};
PrefetchTrial begin_prefetch_trial(size_t weight_bytes);
void end_prefetch_trial(PrefetchTrial t, size_t weight_bytes, double seconds);
bool prefetch_tuned();
// For tools' reports: the distance and how it was chosen.
std::string prefetch_summary();

}  // namespace moe::cpu
