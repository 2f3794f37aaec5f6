// Which routed experts have a copy in VRAM: whole layers homed on the GPU (-ngl without
// -cmoe/-ncmoe), plus a pool of whole-expert slots (gate+up+down) holding the most-routed experts
// of the CPU-homed layers. The pool is filled from the routing profile seen so far; the dynamic
// policy (eviction, admission over PCIe) belongs to the hybrid executor.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/gpu/vram_budget.h"
#include "coordinator/model/cpu_expert_executor.h"

namespace moe::gpu {

struct ResidentExpert {
  const void* gate = nullptr;
  const void* up = nullptr;
  const void* down = nullptr;
};

class ExpertResidency {
 public:
  // `layers`: every layer's expert tensors (mmapped); `gpu_home[l]`: layer l's experts all live
  // in VRAM. `pool_bytes`: size of the slot pool for the other layers (0: none).
  ExpertResidency(VramBudget& budget, const std::vector<model::ExpertLayerTensors>& layers,
                  const std::vector<bool>& gpu_home, int64_t n_expert, uint64_t pool_bytes);
  // VRAM of one whole-expert slot (gate, up, down, each 256-byte aligned) for the largest
  // CPU-homed layer; 0 when every layer is GPU-homed.
  static uint64_t slot_bytes_for(const std::vector<model::ExpertLayerTensors>& layers,
                                 const std::vector<bool>& gpu_home);

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

  // Counts one routing of (layer, expert) toward the profile that fills the pool.
  void record(int64_t layer, int64_t expert) {
    ++counts_[static_cast<size_t>(layer * n_expert_ + expert)];
    ++routed_;
  }
  uint64_t routed() const { return routed_; }
  // The profile: routing counts per (layer, expert), layer-major. set_counts() replaces it (a
  // profile saved by an earlier run); the sizes must match.
  const std::vector<uint64_t>& counts() const { return counts_; }
  void set_counts(const std::vector<uint64_t>& counts);
  // Makes the most-routed CPU-homed experts resident (ties: lower layer, then lower expert),
  // copying only the ones that change. Returns how many were copied.
  int64_t refill();

  // Where the matrices of a CPU-homed layer's expert are once copied into `dst` (slot_bytes() of
  // VRAM), and the copy itself, enqueued on `stream`: an expert streamed over PCIe for one
  // layer's compute.
  ResidentExpert slot_view(int64_t layer, unsigned char* dst) const;
  ResidentExpert stage(int64_t layer, int64_t expert, unsigned char* dst,
                       cudaStream_t stream) const;

  int64_t pool_slots() const { return n_slots_; }
  int64_t pool_filled() const;
  uint64_t slot_bytes() const { return slot_bytes_; }
  std::string summary() const;

 private:
  struct SlotLayout {
    size_t up = 0, down = 0;  // offsets in the slot; gate at 0
  };
  void upload(int64_t layer, int64_t expert, int64_t slot);

  const std::vector<model::ExpertLayerTensors>& layers_;
  std::vector<bool> gpu_home_;
  int64_t n_expert_;
  int64_t n_cpu_layers_ = 0;
  std::vector<VramBuffer> layer_bufs_;  // the expert tensors of each GPU-homed layer
  VramBuffer tables_;                   // device_table() of every layer
  std::vector<SlotLayout> layout_;      // per layer
  uint64_t slot_bytes_ = 0;
  int64_t n_slots_ = 0;
  VramBuffer pool_;
  std::vector<int64_t> slot_owner_;  // layer * n_expert + expert, or -1
  std::vector<ResidentExpert> table_;
  std::vector<uint64_t> counts_;
  uint64_t routed_ = 0;
};

}  // namespace moe::gpu
