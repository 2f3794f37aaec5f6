// ExpertExecutor on the CPU over the mmapped GGUF expert tensors. Items are grouped by expert so
// that each expert's gate/up/down weights are read once per batch (prefill); a single decode token
// simply runs its k experts.
#pragma once

#include <cstdint>
#include <vector>

#include "common/gguf.h"
#include "experts/expert_executor.h"
#include "experts/expert_tensors.h"
#include "experts/model_config.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::model {

class CpuExpertExecutor final : public ExpertExecutor {
 public:
  // `act` is the experts' activation; the biases come with the layers' tensors (gpt-oss).
  CpuExpertExecutor(std::vector<ExpertLayerTensors> layers, int64_t n_embd, int64_t n_ff,
                    int64_t n_expert, cpu::ThreadPool& pool, cpu::Isa isa,
                    ExpertActivation act = ExpertActivation::SiluGlu);

  void run(int64_t layer, const float* x, int64_t n_tokens, std::span<const ExpertItem> items,
           float* out) override;

 private:
  struct ExpertWeights {
    cpu::WeightMatrix gate, up, down;
    const float *gate_b = nullptr, *up_b = nullptr, *down_b = nullptr;  // null: no bias
  };
  // Every expert's gate and up products in one pool dispatch, its down products in a second
  // (decode: many GEMVs; prefill: GEMMs whose weights are read once for all of their rows).
  void run_batched(const std::vector<ExpertWeights>& experts, const float* x,
                   std::span<const ExpertItem> items);
  // g = act(g + gate bias, u + up bias) over `rows` sorted rows of n_ff, rows spread over the
  // pool (row r belongs to expert row_expert_[r]).
  void glu_rows(const std::vector<ExpertWeights>& experts, float* g, float* u, int64_t rows);

  std::vector<std::vector<ExpertWeights>> layers_;  // [layer][expert]
  int64_t n_embd_, n_ff_, n_expert_;
  ExpertActivation act_;
  cpu::ThreadPool& pool_;
  cpu::Isa isa_;
  cpu::MatmulScratch mm_scratch_;
  // Grow-only buffers: after the largest batch has been seen, run() allocates nothing.
  std::vector<int32_t> count_, offset_, order_, row_expert_;
  std::vector<float> xg_, g_, u_, item_out_;
  std::vector<cpu::MatmulJob> jobs_;
};

// The executor for every MoE layer of `f` on `pool` with the best ISA here: what the model uses
// in-process and what a CPU worker process runs (so the two are bitwise equal).
std::unique_ptr<CpuExpertExecutor> cpu_experts_for(const gguf::GgufFile& f, cpu::ThreadPool& pool);

}  // namespace moe::model
