// What every GPU forward shares, so that a model class holds only its layers: the device, the GPU
// executor and the VRAM budget, one stream, token I/O (embeddings in, logits out), the routed
// experts (RoutedExpertsGpu), the per-sequence state in VRAM, the residual and normed row scratch,
// and the forward itself with its commit-or-abandon.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "coordinator/gpu/decode_graphs.h"
#include "coordinator/gpu/gpu_options.h"
#include "coordinator/gpu/gpu_sequence_states.h"
#include "coordinator/gpu/routed_experts_gpu.h"
#include "coordinator/gpu/token_io_gpu.h"
#include "coordinator/gpu/vram_budget.h"
#include "coordinator/model/model_arch.h"
#include "experts/gpu/gpu_executor.h"

namespace moe::gpu {

// One sequence's rows of a batch: rows [row0, row0 + n) of the batch are its tokens at positions
// pos0 onwards, and `seq` holds its state in VRAM.
struct SequenceRows {
  int64_t row0 = 0, n = 0, pos0 = 0;
  GpuSequenceStates::Slot* seq = nullptr;
};

class GpuForward : public model::ModelArch {
 public:
  ~GpuForward() override;

  const model::ModelConfig& config() const override { return cfg_; }
  // K/V (and recurrent state) live in VRAM: the host cache only names the sequence.
  model::KvStorage cache_storage() const override { return model::KvStorage::None; }
  // Runs the batch (run_batch) on the stream and waits for it. Only a batch that completes joins
  // the sequence (K/V positions, recurrent state); one that throws leaves it as it was. The
  // stream is idle whenever no forward runs, so a model's buffers may go in any order.
  void forward(std::span<const int32_t> tokens, model::KvCache& cache, model::LogitsMode mode,
               float* logits, const model::ForwardHooks* hooks) final;
  // Every chunk's rows in one pass over the layers (a weight, and a routed expert, is read once
  // for the whole batch); only attention and the DeltaNet recurrence run per sequence. Commits
  // every sequence, or none, as forward(). One chunk is a forward() (its decode graph included).
  void forward_batch(std::span<const model::SequenceChunk> chunks, float* logits) final;

  // The prompt cache's checkpoints: the recurrent state is copied aside in VRAM.
  void save_checkpoint(model::KvCache& cache) override;
  bool restore_checkpoint(model::KvCache& cache) override;
  // Slot files: the sequence's VRAM state copied to the host and back (GpuSequenceStates).
  void export_sequence(const model::KvCache& cache, model::SequenceImage& image) override;
  void import_sequence(model::KvCache& cache, const model::SequenceImage& image) override;

  // Context shift: the sequence's K/V rows moved and re-roped in VRAM (GpuSequenceStates::shift).
  void shift_context(model::KvCache& cache, int64_t n_keep, int64_t n_discard) override;

  // Device, VRAM use by kind and where the experts live: printed at start.
  std::string describe() const;
  std::string runtime_stats() const override { return experts_->stats(); }
  std::optional<model::ExpertRuntimeStats> expert_runtime() const override {
    return experts_->runtime();
  }
  // The routed experts' live policy (RoutedExpertsGpu::set_policy), changed between forwards:
  // the stream is idle then.
  std::optional<model::ExpertPolicy> expert_policy() const override { return experts_->policy(); }
  model::PolicyOutcome set_expert_policy(const model::ExpertPolicyChange& change) override {
    return experts_->set_policy(change);
  }
  std::vector<model::LayerSplit> layer_split() const override { return experts_->layer_split(); }

 protected:
  // Chooses the device and the executor, creates the stream and the token I/O; refuses partial
  // offload. The model's own layers come next, then place_experts.
  GpuForward(const gguf::GgufFile& file, const GpuOptions& opt);

  // Called by the model's constructor once its dense weights are in VRAM: the experts' pool gets
  // what is left. `cpu_experts` computes the experts without a VRAM copy (null: in-process).
  void place_experts(const gguf::GgufFile& file, cpu::ThreadPool& pool,
                     std::unique_ptr<model::ExpertExecutor> cpu_experts);

  // The layers, on stream_: x holds the embedded rows of every sequence in `seqs` (consecutive,
  // from row 0) on entry and the residual stream after the last layer on return; xn is theirs to
  // use. Per-token work runs once over all rows, attention and recurrences per sequence. `hooks`
  // see row i at position seqs[0].pos0 + i: only with one sequence. device_pos0 (only where
  // graphs_supported(), no hooks): sequence i's positions start at the device int32
  // device_pos0[i]'s value when the kernels run, not at seqs[i].pos0 (a step recorded once in a
  // CUDA graph).
  virtual void enqueue_layers(std::span<const SequenceRows> seqs, const int32_t* device_pos0,
                              const model::ForwardHooks* hooks) = 0;
  // Whether enqueue_layers takes device positions: a step of up to kGraphRows rows whose experts
  // are all routed on the device then replays a CUDA graph (--no-cuda-graphs: never).
  virtual bool graphs_supported() const { return false; }
  // Grows the model's own scratch to n tokens (x and xn are grown here).
  virtual void reserve_layers(int64_t n_tokens) = 0;
  // What of every layer lives in VRAM, for describe().
  virtual std::string dense_summary() const = 0;
  float* scratch(VramBuffer& b, size_t floats, const char* what);
  float* x() { return d_x_.as<float>(); }
  float* xn() { return d_xn_.as<float>(); }

  model::ModelConfig cfg_;
  GpuOptions opt_;
  std::string device_name_;
  uint64_t vram_limit_ = 0;
  // Before budget_: the budget's buffers come from its allocator and go before it.
  std::unique_ptr<GpuExecutor> executor_;
  VramBudget budget_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<TokenIoGpu> io_;
  std::unique_ptr<RoutedExpertsGpu> experts_;
  // The n_seq sequences decoded together and the health probe's the engine interleaves.
  GpuSequenceStates seqs_;
  // The attention's split scratch (attend() grows it; grown up front for a batch of several
  // sequences and before a graph is recorded), and the count of scratch moves a recorded graph
  // checks (bumped whenever reserve() grows the scratch).
  VramBuffer d_attn_ws_;
  uint64_t scratch_epoch_ = 0;

 private:
  void reserve(int64_t n_tokens);
  // Steps of up to this many rows (one token of several sequences, a draft's few tokens) replay
  // graphs; larger batches gain little from one.
  static constexpr int64_t kGraphRows = 8;
  // One batch: embeddings, enqueue_layers, the experts' last work, logits; from a graph where it
  // can (run_graphed).
  void run_batch(std::span<const int32_t> tokens, int64_t pos0, GpuSequenceStates::Slot& seq,
                 model::LogitsMode mode, float* logits, const model::ForwardHooks* hooks);
  // Whether a step of n rows replays a graph.
  bool graphable(int64_t n, const model::ForwardHooks* hooks) const;
  // The step of `seqs` (tokens: every sequence's, in order) from its graph, recorded first when
  // none fits: the logits of every row (all_rows: one sequence) or of each sequence's last row.
  void run_graphed(std::span<const int32_t> tokens, std::span<const SequenceRows> seqs,
                   bool all_rows, float* logits);
  // Moves sequence i's last row of x to row i (x is dead after the layers), for one head launch.
  void gather_last_rows(std::span<const SequenceRows> seqs);
  // A batch of several sequences (forward_batch): embeddings, enqueue_layers, the experts' last
  // work, and the logits of each sequence's last row.
  void run_sequences(std::span<const int32_t> tokens, std::span<const SequenceRows> seqs,
                     float* logits);

  int64_t scratch_tokens_ = 0;
  VramBuffer d_x_, d_xn_;         // residual rows, normed rows
  DecodeGraphs graphs_{budget_};  // one per sequence slot
};

}  // namespace moe::gpu
