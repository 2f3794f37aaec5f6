// Measured rates of this machine that decide the GPU/CPU expert split: host->device copy
// bandwidth, the GPU's and the CPU's time per decode expert item (the CPU's per thread count).
// Measuring takes seconds, so the result is cached per machine in one JSON file holding entries
// for several keys (another GPU, thread count or quantization is another key) and later starts
// skip it (--recalibrate measures again). The file is written atomically; a file that is not a
// calibration cache is refused with a message naming it on load and simply replaced on save.
// This file holds the data, its cache and the CPU-side measurement; online timings refine the
// numbers elsewhere.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "experts/expert_executor.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::model {

struct MachineCalibration {
  std::string key;      // what the numbers are valid for (see machine_key)
  double h2d_gbps = 0;  // pinned host->device copy bandwidth, GB/s (10^9); 0 = not measured
  double gpu_us_per_expert = 0;  // one decode expert item (gate+up+down, 1 token) on the GPU, µs
  // Device memory bandwidth, GB/s: bytes read plus written by a device-to-device copy; 0 = not
  // measured (optional in the file: entries written before it was measured lack it).
  double gpu_gbps = 0;
  // (threads, µs per decode expert item), threads strictly ascending.
  std::vector<std::pair<int, double>> cpu_us_per_expert;
  std::string measured_at;  // ISO-8601 UTC time of the measurement (see utc_now_iso8601)

  // µs per item at `threads`: the exact entry, else linear interpolation between the neighbouring
  // thread counts, else the nearest end (no extrapolation: scaling past the measured range is
  // unknown); 0 when nothing was measured.
  double cpu_us_at(int threads) const;
};

// "cpu=<cpu_model_name()>|gpu=<gpu_name>|threads=<threads>|expert=<expert_desc>". Callers pass
// the GPU name and the expert description (e.g. "<type names>:<bytes per expert>") in, so this
// file needs neither CUDA nor a model.
std::string machine_key(const std::string& gpu_name, int threads, const std::string& expert_desc);
// The "model name" of the first processor in /proc/cpuinfo, or "unknown".
std::string cpu_model_name();
// Now, as "YYYY-MM-DDTHH:MM:SSZ".
std::string utc_now_iso8601();

// <dir>/calibration.json with <dir>: $MOE_CACHE_DIR, else $XDG_CACHE_HOME/moe-runtime, else
// $HOME/.cache/moe-runtime, else <temp dir>/moe-runtime (unset and empty variables are skipped).
std::string default_calibration_path();

// nullopt when `path` or the entry for `key` does not exist; moe::Error naming the file when it
// exists but cannot be read or is malformed (bad JSON, wrong "format" or "version", a missing or
// mistyped field, negative or non-finite numbers, unsorted or duplicate thread counts, duplicate
// keys). Every entry is checked, not only `key`'s.
std::optional<MachineCalibration> load_calibration(const std::string& path, const std::string& key);
// Adds or replaces the entry for c.key, keeping the other keys' entries (an existing file that is
// malformed is replaced without complaint: it is only a cache). Creates the directory; writes a
// temporary file beside `path`, fsyncs it and renames it over `path`. Throws moe::Error naming
// the file when it cannot be written or `c` itself is invalid (the rules of load_calibration).
// Two processes saving at once may lose one of their entries (last rename wins): harmless for
// a cache, the loser measures again next start.
void save_calibration(const std::string& path, const MachineCalibration& c);

// Median µs per decode expert item of an executor at each of `thread_counts` (strictly
// ascending), returned in that order. For each count, `make_exec(pool)` builds an executor on a
// temporary cpu::ThreadPool(threads, {}, spin), makes runs 0 .. warm_runs-1 untimed (page faults,
// scratch), then runs 0 .. reps-1 timed. Run j is exec.run(layers[j % L], x, 1 token, items, out)
// with `items_per_run` distinct experts ((j / L) * items_per_run + i) % n_expert (L layers),
// weight 1/items_per_run each, x random-normal from a fixed seed: runs read distinct weights
// for j < L * (n_expert / items_per_run), and a timed run's weights were last read warm_runs - 1
// runs earlier, so a warm_runs whose weights exceed the last-level cache times a decode's reads
// from memory, not from the cache. warm_runs <= reps (0: the default) means reps. µs per item =
// median timed run / items_per_run. Throws moe::Error on bad arguments (no layers, more items
// than experts, ...) or a null executor.
std::vector<std::pair<int, double>> measure_cpu_expert_rates(
    const std::function<std::unique_ptr<ExpertExecutor>(cpu::ThreadPool&)>& make_exec,
    const std::vector<int64_t>& layers, int64_t n_expert, int64_t n_embd,
    const std::vector<int>& thread_counts, int items_per_run, int reps,
    int spin = cpu::ThreadPool::kDefaultSpin, int warm_runs = 0);

// Untimed runs for measure_cpu_expert_rates() whose weights (items_per_run experts of
// expert_bytes each per run) add up to at least `reuse_bytes`, at least `reps`, and no more than
// the runs that read distinct weights (layers * (n_expert / items_per_run)).
int calibration_warm_runs(int64_t reuse_bytes, int64_t expert_bytes, int items_per_run, int reps,
                          int64_t n_layers, int64_t n_expert);

// 1, 2, 4, ... below max_threads, then max_threads itself (always included). moe::Error when
// max_threads < 1.
std::vector<int> calibration_thread_counts(int max_threads);

}  // namespace moe::model
