// The live policy of a GPU forward's routed experts (issue 29 §4): what an operator reads and
// changes while the server runs (moe.v1.Control's GetExpertPolicy / SetExpertPolicy /
// Recalibrate, `moe-cli policy`), and how each MoE layer's experts are split between VRAM, the
// GPU's in-place reads and the CPU (GetPlacement). Plain data and validation, no CUDA: the
// CPU-only forward has no policy, and the engine applies a change between steps.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

namespace moe::model {

// The current policy. Shares are 0..1, or kAutoShare for "measured as it runs" (the flags'
// `auto`).
struct ExpertPolicy {
  static constexpr double kAutoShare = -1;
  // The pool of whole-expert VRAM slots for CPU-homed experts (--moe-resident-mib): its VRAM, its
  // slots and how many hold an expert, one slot's bytes, and the most the pool could hold now
  // (its own VRAM plus what the budget has free).
  uint64_t pool_bytes = 0, pool_max_bytes = 0, slot_bytes = 0;
  int64_t pool_slots = 0, pool_filled = 0;
  double stream_share = 0;       // --moe-stream-share
  double direct_share = -1;      // --moe-direct-share
  double prefill_cpu_share = 0;  // --moe-prefill-cpu-share
  // The shares in effect (auto resolved from the measured rates; 0 while unmeasured).
  double direct_share_now = 0;
  bool profiler_new = false;   // --moe-resident-profiler new (false: old)
  bool grouping = false;       // --moe-resident-grouping layout
  uint64_t changes = 0;        // changes applied since start
  double recalibrated_ms = 0;  // how long the last Recalibrate measured (0: none since start)
};

// A change: only what is set changes. pool_mib 0 removes the pool.
struct ExpertPolicyChange {
  std::optional<int64_t> pool_mib;
  std::optional<double> stream_share, direct_share, prefill_cpu_share;  // or kAutoShare
  std::optional<bool> profiler_new, grouping;
  bool recalibrate = false;  // measure the machine's rates again (--recalibrate), then apply
  bool empty() const {
    return !pool_mib && !stream_share && !direct_share && !prefill_cpu_share && !profiler_new &&
           !grouping && !recalibrate;
  }
};

// What became of a change: Applied; Unsupported (nothing to change here: no GPU forward, or no
// CPU-homed experts for a pool); NoRoom (the VRAM budget cannot hold the pool asked for);
// Failed (the device failed midway: the message says what state it was left in). Nothing changed
// unless Applied or Failed.
struct PolicyOutcome {
  enum Kind { Applied, Unsupported, NoRoom, Failed } kind = Applied;
  std::string message;
};

// Why a forward without a GPU has no policy.
inline constexpr const char* kNoExpertPolicy =
    "every routed expert runs on the CPU (no GPU forward): the expert policy is that of a GPU "
    "with CPU-homed experts (-ngl 99 with -cmoe or -ncmoe N)";

// Upper bound on pool_mib (1 PiB): refuses a number no machine could mean before it is multiplied.
inline constexpr int64_t kMaxPoolMib = int64_t{1} << 30;

// "" when every field set is in range, else a message naming the first bad field as the flag
// spells it ("--moe-stream-share must be between 0 and 1 or auto, got 1.5").
std::string validate(const ExpertPolicyChange& change);

// Parses a share as the flags spell it: "auto" (kAutoShare) or a number in [0, 1]; nullopt
// otherwise. Inline, as format_share: moe-cli uses them without linking the library.
inline std::optional<double> parse_share(const std::string& text) {
  if (text == "auto") return ExpertPolicy::kAutoShare;
  if (text.empty() || text.size() > 32) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !(v >= 0 && v <= 1)) return std::nullopt;
  return v;
}
// "auto" or the number ("0.3").
inline std::string format_share(double share) {
  if (share == ExpertPolicy::kAutoShare) return "auto";
  char text[32];
  std::snprintf(text, sizeof text, "%g", share);
  return text;
}

// Where one MoE layer's routed experts are now: every expert in VRAM (a GPU-homed layer), or a
// CPU-homed layer's experts with a pool slot, those the GPU reads in place from the page-locked
// model, and the rest computed on the CPU. vram + direct + cpu = the layer's experts.
struct LayerSplit {
  int64_t layer = 0;
  bool gpu_home = false;
  int64_t vram = 0, direct = 0, cpu = 0;
};

// Every MoE layer's experts on the CPU (the CPU-only forward's split).
std::vector<LayerSplit> all_on_cpu(int64_t n_layer, int64_t n_expert);

}  // namespace moe::model
