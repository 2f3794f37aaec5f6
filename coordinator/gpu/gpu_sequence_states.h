// The per-sequence state a GPU forward keeps in VRAM: K/V rows of every attention layer and, for a
// hybrid model, the recurrent state (conv window and DeltaNet matrices) of every recurrent layer.
// The host KvCache stays the sequence's identity and position count; a few slots (the engine
// interleaves a one-token health probe with the running request) are tied to the caches they
// were evaluated for. The recurrent state is double buffered like model::RecurrentState: a
// forward reads the committed buffer and writes the other, and only commit() after the whole
// batch succeeded makes it current, so a forward that throws leaves the sequence as it was.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <vector>

#include "common/ggml_type.h"
#include "coordinator/gpu/vram_budget.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/model/sequence_image.h"
#include "experts/model_config.h"
#include "kernels/cuda/attention.h"

namespace moe::gpu {

class GpuSequenceStates {
 public:
  struct RecurrentView {
    const float* conv_in = nullptr;  // [kernel - 1][channels]; null: zeros (sequence start)
    float* conv_out = nullptr;
    const float* ssm_in = nullptr;  // [n_v_heads][head_v][head_k]; null: zeros
    float* ssm_out = nullptr;
  };

  class Slot {
   public:
    const cuda::DeviceKvLayer& kv(int64_t layer) const;  // throws for a recurrent layer
    RecurrentView recurrent(int64_t layer);              // throws for an attention layer
    // Changes whenever the slot's buffers are (re)allocated: work recorded against the old
    // addresses (a CUDA graph) must be recorded again.
    uint64_t generation() const { return generation_; }
    // Which recorded step fits the slot now: a hybrid model's step reads one recurrent buffer and
    // writes the other, which swap at every commit (and the first step reads zeros), so it records
    // up to three; 0 for a model without recurrent layers.
    int graph_variant() const { return !recurrent_ ? 0 : zero_ ? 2 : cur_; }

   private:
    friend class GpuSequenceStates;
    struct Layer {
      VramBuffer k, v;
      cuda::DeviceKvLayer view{};
      VramBuffer conv[2], ssm[2];      // recurrent layers only
      VramBuffer ckpt_conv, ckpt_ssm;  // the checkpoint's copy, allocated at the first one
      VramBuffer ckpt_k, ckpt_v;       // a sliding-window ring's copy, likewise
    };
    const model::KvCache* owner_ = nullptr;
    int64_t past_ = 0;  // owner's n_past after our last forward on it
    uint64_t last_use_ = 0;
    int64_t ctx_ = 0;
    std::vector<cuda::DeviceKvLayer> layout_;  // types and rotation per layer (no addresses)
    uint64_t generation_ = 0;
    int cur_ = 0;             // the committed recurrent buffer
    bool zero_ = true;        // the committed recurrent state is all zeros
    bool recurrent_ = false;  // the model has recurrent layers
    std::vector<Layer> layers_;
    int64_t ckpt_pos_ = -1;  // -1: no checkpoint
    bool ckpt_zero_ = true;
    uint64_t ckpt_generation_ = 0;
  };

  GpuSequenceStates(VramBudget& budget, const model::ModelConfig& cfg, size_t max_sequences);

  // The VRAM state of `cache`'s sequence. A cache at position 0 gets a slot (its own, a free one,
  // else the least recently used); a cache past 0 must be the one this object evaluated up to
  // exactly there, else moe::Error. Every KvType runs on the GPU; types and rotation may differ
  // per layer, as the cache says.
  Slot& acquire(const model::KvCache& cache);
  // acquire() for every sequence of one batch (distinct caches), slot i for caches[i]. Each
  // continuing sequence's slot is checked before a new sequence of the batch gets one, and a new
  // sequence never takes a slot of this batch: with no other slot left it throws moe::Error. Every
  // error but a failed VRAM allocation is thrown before a slot changes.
  std::vector<Slot*> acquire(std::span<const model::KvCache* const> caches);
  // After a forward succeeded: the slot is at `n_past` and the recurrent state it wrote is current.
  static void commit(Slot& slot, int64_t n_past);

  // The prompt cache's checkpoint (KvCache::save_checkpoint): the recurrent state of `cache`'s
  // sequence at its current position and its sliding-window rings copied aside in VRAM, enqueued
  // on `stream`. Other K/V rows need no copy: rows past a position are written again. moe::Error
  // if the sequence is not here.
  void save_checkpoint(const model::KvCache& cache, cudaStream_t stream);
  // Copies it back and puts the slot at the checkpoint's position; false when the sequence's slot
  // went to another cache or was reallocated since (the caller starts from scratch).
  bool restore_checkpoint(const model::KvCache& cache, cudaStream_t stream);

  // Slot files (GpuForward::export_sequence): rows [0, n_past) of `cache`'s sequence (of a
  // sliding-window ring its last min(n_past, ring) in position order, as KvCache::export_image)
  // and its committed recurrent state copied to host bytes on `stream` (then synchronized).
  // moe::Error if the sequence is not here.
  void export_sequence(const model::KvCache& cache, model::SequenceImage& image,
                       cudaStream_t stream);
  // `image` into a slot for `cache`, which must be at position 0 (acquire's slot for a new
  // sequence). The slot is then the cache's at image.n_past, with no checkpoint and a new
  // generation (graphs recorded on it are recorded again). The caller checked the image against
  // the cache (KvCache::check_image) and moves the cache to image.n_past (KvCache::restore).
  void import_sequence(const model::KvCache& cache, const model::SequenceImage& image,
                       cudaStream_t stream);

  // Context shift (GpuForward::shift_context): cuda::kv_shift of every attention layer of `cache`'s
  // sequence, its first cache.n_past() rows, on `stream` (then synchronized); `cs` is
  // model::shift_angles. The slot is then at n_past - n_discard with no checkpoint and a new
  // generation (a graph recorded on it is recorded again). The caller checked the arguments
  // (model::check_shift); moe::Error, nothing changed, if the sequence is not here or keeps a
  // sliding-window ring (--swa-full keeps every position and shifts).
  void shift(const model::KvCache& cache, int64_t n_keep, int64_t n_discard, const float* cs,
             cudaStream_t stream);

  // Bytes of one sequence's state at `n_ctx` positions with the cache types of `kv` (pool
  // auto-sizing: a q4_0 cache, or sliding-window rings, leave more VRAM to the experts).
  static uint64_t estimate_bytes(const model::ModelConfig& cfg, int64_t n_ctx,
                                 const model::KvConfig& kv);

 private:
  // The K/V types, rotation and ring `cache` asks for, per layer; throws for a type the GPU lacks.
  std::vector<cuda::DeviceKvLayer> layout_of(const model::KvCache& cache) const;
  void allocate(Slot& s, const model::KvCache& cache, std::vector<cuda::DeviceKvLayer> layout);

  VramBudget& budget_;
  const model::ModelConfig& cfg_;
  size_t max_sequences_;
  std::vector<Slot> slots_;
  uint64_t clock_ = 0;
};

}  // namespace moe::gpu
