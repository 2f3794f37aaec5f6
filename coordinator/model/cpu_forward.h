// What the CPU forwards share, so that a model class holds only its layers: the config, the
// thread pool and ISA, token embeddings and the output head, the routed experts (RoutedMoeCpu),
// the residual and normed rows, and the forward itself: checks, embedding, the model's layers,
// the logits, and the caches advanced only when the batch completed. forward_batch puts several
// sequences' rows in one pass: the layers run every per-token op once over all rows and only
// RoPE, the K/V store, attention and the recurrent mixers per sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "coordinator/model/model_arch.h"
#include "coordinator/model/op_profile.h"
#include "coordinator/model/routed_moe_cpu.h"
#include "experts/expert_tensors.h"
#include "experts/tensor_table.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"

namespace moe::model {

// One sequence's rows in a pass over the layers: rows [row0, row0 + n) of x_ are its tokens at
// positions pos0 (= cache->n_past()) onwards.
struct SequenceRows {
  int64_t row0 = 0, n = 0, pos0 = 0;
  KvCache* cache = nullptr;
};

class CpuForward : public ModelArch {
 public:
  const ModelConfig& config() const override { return cfg_; }
  void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsMode mode, float* logits,
               const ForwardHooks* hooks) final;
  void forward_batch(std::span<const SequenceChunk> chunks, float* logits) final;
  bool set_op_profile(OpProfile* profile) override {
    prof_ = profile;
    return true;
  }

 protected:
  // Reads the config, the embeddings and the output head.
  CpuForward(const gguf::GgufFile& file, cpu::ThreadPool& pool);

  // Called by the model's constructor with every layer's expert tensors (checked at load even
  // when another executor computes them: a broken file fails there). `experts` null: a
  // CpuExpertExecutor on the pool.
  void set_experts(std::vector<ExpertLayerTensors> tensors,
                   std::unique_ptr<ExpertExecutor> experts);

  // The layers over n_tokens rows, the sequences `seqs` one after another (row0 ascending, no
  // gap): x_ holds the embedded rows on entry and the residual stream after the last layer on
  // return; xn_ is theirs to use. Sized for n tokens by the time this runs. Hooks come only with
  // one sequence (forward()).
  virtual void run_layers(int64_t n_tokens, std::span<const SequenceRows> seqs,
                          const ForwardHooks* hooks) = 0;
  // Grows the model's own scratch to n tokens.
  virtual void reserve_layers(int64_t n_tokens) = 0;
  // Refuses a cache this model cannot use (before anything runs).
  virtual void check_cache(const KvCache& /*cache*/) const {}

  // The models' scratch and residual helpers: v grown to at least n (never shrunk), its data;
  // x[i] += y[i] for n values.
  template <typename T>
  static T* grow(std::vector<T>& v, int64_t n) {
    if (v.size() < static_cast<size_t>(n)) v.resize(static_cast<size_t>(n));
    return v.data();
  }
  static void add_rows(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] += y[i];
  }

  // Grows x_, xn_ and every layer scratch to n tokens.
  void reserve(int64_t n_tokens);
  // For a multi-token-prediction block: the token embeddings, the output norm's gains and the
  // output head.
  void embed_rows(std::span<const int32_t> tokens, float* x) const { emb_.embed(tokens, x); }
  const std::vector<float>& output_norm() const { return output_norm_; }
  const cpu::WeightMatrix& output_head() const { return output_; }

  ModelConfig cfg_;
  cpu::ThreadPool& pool_;
  cpu::Isa isa_;
  cpu::MatmulScratch mm_;  // grow-only
  RoutedMoeCpu moe_;
  std::vector<float> x_, xn_;  // residual rows, normed rows
  OpProfile* prof_ = nullptr;  // moe-bench --op-profile's, else null

 private:
  std::vector<SequenceRows> seqs_;  // forward_batch's, grow-only
  EmbeddingTensors emb_;
  std::vector<float> output_norm_;
  cpu::WeightMatrix output_;
};

}  // namespace moe::model
