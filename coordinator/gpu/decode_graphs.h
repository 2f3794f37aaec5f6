// Decode steps replayed from CUDA graphs, for the GPU forwards whose whole step runs on the device:
// a step is ~20 small kernels per layer, and one graph launch hands all of them to the GPU at once.
// A graph is recorded per step shape: which sequence slots take part (each with the recurrent
// buffer its step reads, Slot::graph_variant()), how many tokens each brings and which logits rows
// leave. Each sequence's first position is read on the device (device_pos()), so one recording
// serves every position: a decode step of one sequence, of several sequences decoded together,
// or a draft's verification of a few tokens.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "coordinator/gpu/cuda_graph.h"
#include "coordinator/gpu/gpu_sequence_states.h"
#include "coordinator/gpu/pinned_buffer.h"
#include "coordinator/gpu/vram_budget.h"

namespace moe::gpu {

class DecodeGraphs {
 public:
  // Sequences one graphed step may hold, and graphs kept (the least recently used goes first).
  static constexpr size_t kMaxSequences = 64;
  static constexpr size_t kMaxGraphs = 32;

  explicit DecodeGraphs(VramBudget& budget);

  // The device int32s a recorded step reads its sequences' first positions from, in order.
  const int32_t* device_pos() const { return d_pos_.as<int32_t>(); }

  // One sequence of a step: its slot, its first position and its token count.
  struct Part {
    GpuSequenceStates::Slot* slot;
    int64_t pos0, n;
  };
  // Enqueues the parts' positions into device_pos(), then launches the step's graph on `stream`.
  // The graph is recorded first when none matches the parts (slots, their variants, token
  // counts) and `rows_out`, or a slot's buffers, the forward's scratch (scratch_epoch) or its
  // attention scratch moved since: `prepare` grows what the recording needs (nothing may be
  // allocated inside a capture), then `record` enqueues the step reading device_pos(). Returns
  // true when it recorded (recording ran the step's host side once; a replay did not). moe::Error
  // for more than kMaxSequences parts.
  bool launch(std::span<const Part> parts, int64_t rows_out, uint64_t scratch_epoch,
              const VramBuffer& attention_ws, cudaStream_t stream,
              const std::function<void()>& prepare, const std::function<void()>& record);

 private:
  // A graph holds device addresses: what it was recorded against.
  struct Graph {
    CudaGraph graph;
    std::vector<const GpuSequenceStates::Slot*> slots;
    std::vector<int> variants;
    std::vector<int64_t> counts;
    std::vector<uint64_t> generations;
    int64_t rows_out = 0;
    uint64_t scratch_epoch = 0;
    const void* attention_ws = nullptr;  // an eager step may move it without an epoch
    uint64_t last_use = 0;
  };
  std::vector<std::unique_ptr<Graph>> graphs_;
  uint64_t clock_ = 0;
  VramBuffer d_pos_;
  PinnedBuffer h_pos_;
};

}  // namespace moe::gpu
