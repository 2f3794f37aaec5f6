// Private to RoutedExpertsGpu's .cpp files (routed_experts_gpu*.cpp): helpers more than one needs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "experts/expert_tensors.h"

namespace moe::gpu::routed_internal {

// Packs the per-layer expert lists into one pinned block so a single copy moves them.
class MetaWriter {
 public:
  explicit MetaWriter(unsigned char* base) : base_(base) {}
  template <typename T>
  T* take(int64_t n) {
    off_ = (off_ + 15) & ~size_t{15};
    T* p = reinterpret_cast<T*>(base_ + off_);
    off_ += static_cast<size_t>(n) * sizeof(T);
    return p;
  }
  size_t size() const { return off_; }

 private:
  unsigned char* base_;
  size_t off_ = 0;
};

// Bytes of one expert's gate, up and down matrices: what one copy over PCIe moves.
inline uint64_t expert_bytes(const model::ExpertLayerTensors& t) {
  return t.gate.expert_bytes() + t.up.expert_bytes() + t.down.expert_bytes();
}

// A moving average over the last few layers: they differ little, but a busy machine can slow one.
inline void average(double& avg, double sample) {
  avg = avg > 0 ? 0.75 * avg + 0.25 * sample : sample;
}

}  // namespace moe::gpu::routed_internal
