// Decode steps replayed from CUDA graphs, one graph per sequence slot (and per recurrent buffer
// the step reads, Slot::graph_variant()), for the GPU forwards whose whole step runs on the device:
// a step is ~20 small kernels per layer, and one graph launch hands all of them to the GPU at once.
// The step's position is read on the device (device_pos()), so one recording serves every position
// of its slot.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "coordinator/gpu/cuda_graph.h"
#include "coordinator/gpu/gpu_sequence_states.h"
#include "coordinator/gpu/pinned_buffer.h"
#include "coordinator/gpu/vram_budget.h"

namespace moe::gpu {

class DecodeGraphs {
 public:
  explicit DecodeGraphs(VramBudget& budget);

  // The device int32 a recorded step reads its position from.
  const int32_t* device_pos() const { return d_pos_.as<int32_t>(); }

  // Enqueues pos0 into device_pos(), then launches seq's graph for its current variant on `stream`.
  // The graph is recorded first when seq has none, or seq's buffers, the forward's scratch
  // (scratch_epoch) or its attention scratch moved since it was: `prepare` grows what the recording
  // needs (nothing may be allocated inside a capture), then `record` enqueues the step reading
  // device_pos(). Returns true when it recorded (recording ran the step's host side once; a replay
  // did not).
  bool launch(int64_t pos0, GpuSequenceStates::Slot& seq, uint64_t scratch_epoch,
              const VramBuffer& attention_ws, cudaStream_t stream,
              const std::function<void()>& prepare, const std::function<void()>& record);

 private:
  // A graph holds device addresses: what it was recorded against.
  struct Graph {
    CudaGraph graph;
    const GpuSequenceStates::Slot* slot = nullptr;
    int variant = 0;
    uint64_t slot_generation = 0;
    uint64_t scratch_epoch = 0;
    const void* attention_ws = nullptr;  // an eager step may move it without an epoch
  };
  std::vector<std::unique_ptr<Graph>> graphs_;
  VramBuffer d_pos_;
  PinnedBuffer h_pos_;
};

}  // namespace moe::gpu
