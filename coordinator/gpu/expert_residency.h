// Which routed experts have a copy in VRAM: whole layers homed on the GPU (-ngl without
// -cmoe/-ncmoe), plus a pool of whole-expert slots (gate+up+down) holding experts of the
// CPU-homed layers. Which ones is model::ResidencyPolicy's choice (frequency with recency, one
// pool or per-layer ranges): refill() re-plans the whole pool from the routing seen so far, and
// admit() lets a decode miss that is copied over PCIe anyway stay in the pool when it is hotter
// than the expert it displaces.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/gpu/vram_budget.h"
#include "coordinator/residency/residency_policy.h"
#include "experts/cpu_expert_executor.h"

namespace moe::gpu {

struct ResidentExpert {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
};

class ExpertResidency {
 public:
  // `layers`: every layer's expert tensors (mmapped); `gpu_home[l]`: layer l's experts all live
  // in VRAM. `pool_bytes`: size of the slot pool for the other layers (0: none), its slots
  // grouped as `grouping` says (--moe-resident-grouping).
  ExpertResidency(VramBudget& budget, const std::vector<model::ExpertLayerTensors>& layers,
                  const std::vector<bool>& gpu_home, int64_t n_expert, uint64_t pool_bytes,
                  model::Grouping grouping = model::Grouping::Off);
  // Routing scores halve every this many tokens: about a minute of decode, so the pool follows a
  // change of topic within minutes while an expert routed throughout stays.
  static constexpr double kHalfLifeTokens = 4096;
  // VRAM of one whole-expert slot (gate, up, down, each 256-byte aligned) for the largest
  // CPU-homed layer; 0 when every layer is GPU-homed.
  static uint64_t slot_bytes_for(const std::vector<model::ExpertLayerTensors>& layers,
                                 const std::vector<bool>& gpu_home);
  // Slots of a pool of `pool_bytes`: at most one per CPU-homed expert.
  static int64_t pool_slots_for(const std::vector<model::ExpertLayerTensors>& layers,
                                const std::vector<bool>& gpu_home, int64_t n_expert,
                                uint64_t pool_bytes);

  // The VRAM copy of (layer, expert), or nullptr when it is computed on the CPU.
  const ResidentExpert* find(int64_t layer, int64_t expert) const {
    const ResidentExpert& r = table_[static_cast<size_t>(layer * n_expert_ + expert)];
    return r.gate ? &r : nullptr;
  }
  bool layer_on_gpu(int64_t layer) const { return gpu_home_[static_cast<size_t>(layer)]; }
  // Device array of 3 * n_expert pointers (gate, up, down of each expert) of a GPU-homed layer,
  // for routing on the device; nullptr for a CPU-homed layer.
  const void* const* device_table(int64_t layer) const {
    return layer_on_gpu(layer) ? tables_.as<const void*>() + layer * n_expert_ * 3 : nullptr;
  }
  bool has_cpu_experts() const { return n_cpu_layers_ > 0; }
  // Device array of 3 * n_expert pointers of any layer: a CPU-homed layer's experts with a pool
  // slot have their slot's, those read in place (set_direct()) their mapped host memory, the
  // others null. Brought up to date first (a copy enqueued on `stream`) when the pool or the
  // direct set changed since it was last synced.
  const void* const* synced_table(int64_t layer, cudaStream_t stream);
  // Marks (layer, expert) of a CPU-homed layer to be read by the GPU in place over PCIe, at
  // `view` (its matrices in page-locked host memory, as device addresses), when it has no pool
  // slot; an empty view unmarks it.
  void set_direct(int64_t layer, int64_t expert, const ResidentExpert& view);
  // Whether device routing sends (layer, expert) to the GPU's in-place reads.
  bool direct(int64_t layer, int64_t expert) const {
    const auto i = static_cast<size_t>(layer * n_expert_ + expert);
    return !table_[i].gate && direct_[i].gate;
  }

  // Counts one routing of (layer, expert) toward the profile that fills the pool, and `weight`
  // toward its residency score.
  void record(int64_t layer, int64_t expert, double weight) {
    ++counts_[static_cast<size_t>(layer * n_expert_ + expert)];
    ++routed_;
    policy_.touch(layer, expert, weight);
  }
  // A forward of n tokens starts: the clock the routing scores decay with.
  void tick(int64_t n_tokens) { policy_.tick(n_tokens); }
  // The LFRU score of (layer, expert) now: how much it was routed lately.
  double score(int64_t layer, int64_t expert) const { return policy_.score(layer, expert); }
  uint64_t routed() const { return routed_; }
  // The profile: routing counts per (layer, expert), layer-major. set_counts() replaces it (a
  // profile saved by an earlier run); the sizes must match.
  const std::vector<uint64_t>& counts() const { return counts_; }
  void set_counts(const std::vector<uint64_t>& counts);
  // Makes the highest-scored CPU-homed experts resident (ties: lower layer, then lower expert),
  // copying only the ones that change (synchronously: call between forwards). Returns how many
  // were copied.
  int64_t refill();

  // Decode admission, for one layer visit: pin() every expert the visit routes to, then admit()
  // each miss that will be copied over PCIe: the pool slot to copy it into (find() returns it
  // from now on; the caller enqueues the copy with stage() before any kernel reads it), or
  // nullptr when it stays out (no hotter-than-victim slot); then unpin_all().
  unsigned char* admit(int64_t layer, int64_t expert);
  void pin(int64_t layer, int64_t expert) { policy_.pin(layer, expert); }
  void unpin_all() { policy_.unpin_all(); }
  int64_t admissions() const { return policy_.admissions(); }
  int64_t evictions() const { return policy_.evictions(); }
  // Where the matrices of a CPU-homed layer's expert are once copied into `dst` (slot_bytes() of
  // VRAM), and the copy itself, enqueued on `stream`: an expert streamed over PCIe for one
  // layer's compute.
  ResidentExpert slot_view(int64_t layer, unsigned char* dst) const;
  ResidentExpert stage(int64_t layer, int64_t expert, unsigned char* dst,
                       cudaStream_t stream) const;
  // A chunk of `capacity` slots at `chunk` laid out by matrix (every expert's gate, then every
  // up, then every down) instead of by slot: a run of consecutive experts then moves in three
  // copies, one per matrix, instead of three per expert (PCIe moves 14 MiB copies at ~55 GB/s,
  // 1 MiB ones at ~48). stage_run copies experts first .. first + count - 1 of a CPU-homed layer
  // to places at .. at + count - 1 of the chunk; chunk_view says where place `at`'s matrices are.
  void stage_run(int64_t layer, int64_t first, int64_t count, unsigned char* chunk,
                 int64_t capacity, int64_t at, cudaStream_t stream) const;
  ResidentExpert chunk_view(int64_t layer, unsigned char* chunk, int64_t capacity,
                            int64_t at) const;

  // A pool of `pool_bytes` grouped as `g` instead (SetExpertPolicy, between forwards): the old
  // pool's VRAM goes back to the budget first, the new one is allocated and filled with the
  // hottest experts by refill() (the scores stay). Returns how many experts were copied. On a
  // failed allocation the pool is left empty (no slots) and the error is rethrown.
  int64_t reshape(uint64_t pool_bytes, model::Grouping g);
  model::Grouping grouping() const { return policy_.grouping(); }
  int64_t pool_slots() const { return n_slots_; }
  uint64_t pool_bytes() const { return slot_bytes_ * static_cast<uint64_t>(n_slots_); }
  int64_t pool_filled() const;
  // How many of a CPU-homed layer's experts have a pool slot, and how many more are read in place.
  std::pair<int64_t, int64_t> resident_and_direct(int64_t layer) const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  std::string summary() const;

 private:
  struct SlotLayout {
    size_t up = 0, down = 0;  // offsets in the slot; gate at 0
  };
  void upload(int64_t layer, int64_t expert, int64_t slot);
  unsigned char* slot_base(int64_t slot) const {
    return pool_.as<unsigned char>() + static_cast<size_t>(slot) * slot_bytes_;
  }
  // Points (layer, expert) at slot s's copy, clearing the slot's previous owner (-1: empties it).
  void assign(int64_t slot, int64_t key);

  VramBudget& budget_;
  const std::vector<model::ExpertLayerTensors>& layers_;
  std::vector<bool> gpu_home_;
  int64_t n_expert_;
  int64_t n_cpu_layers_ = 0;
  std::vector<VramBuffer> layer_bufs_;  // the expert tensors of each GPU-homed layer
  VramBuffer tables_;                   // device_table() of every layer
  std::vector<char> table_stale_;       // per layer: table_ changed since tables_ was synced
  std::vector<const void*> table_row_;  // synced_table()'s staging
  std::vector<SlotLayout> layout_;      // per layer
  uint64_t slot_bytes_ = 0;
  int64_t n_slots_ = 0;
  VramBuffer pool_;
  std::vector<int64_t> slot_owner_;  // layer * n_expert + expert, or -1
  std::vector<ResidentExpert> table_;
  std::vector<ResidentExpert> direct_;  // set_direct()'s views, by layer * n_expert + expert
  std::vector<uint64_t> counts_;        // the saved profile: plain counts, no decay
  uint64_t routed_ = 0;
  model::ResidencyPolicy policy_;
};

}  // namespace moe::gpu
