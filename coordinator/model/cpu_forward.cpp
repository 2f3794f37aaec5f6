// CpuForward: embeddings, the output head and the forward around a model's layers.
#include "coordinator/model/cpu_forward.h"

#include "coordinator/model/batch_routing.h"
#include "experts/cpu_expert_executor.h"
#include "kernels/cpu/rmsnorm.h"

namespace moe::model {

CpuForward::CpuForward(const gguf::GgufFile& f, cpu::ThreadPool& pool)
    : cfg_(ModelConfig::from_gguf(f)), pool_(pool), isa_(cpu::best_isa()), moe_(cfg_) {
  emb_ = require_embedding_tensors(f, cfg_.n_embd, cfg_.n_vocab);
  output_norm_ = vector_f32(*emb_.output_norm);
  output_ = weight_matrix(*emb_.output);
}

void CpuForward::set_experts(std::vector<ExpertLayerTensors> tensors,
                             std::unique_ptr<ExpertExecutor> experts) {
  moe_.set_executor(experts ? std::move(experts)
                            : std::make_unique<CpuExpertExecutor>(std::move(tensors), cfg_.n_embd,
                                                                  cfg_.n_ff_exp, cfg_.n_expert,
                                                                  pool_, isa_));
}

void CpuForward::forward(std::span<const int32_t> tokens, KvCache& cache, LogitsMode mode,
                         float* logits, const ForwardHooks* hooks) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t E = cfg_.n_embd;
  check_tokens(tokens, cfg_.n_vocab);
  cache.check_room(n);
  check_cache(cache);
  const int64_t pos0 = cache.n_past();
  if (x_.size() < static_cast<size_t>(n * E)) {
    x_.resize(static_cast<size_t>(n * E));
    xn_.resize(static_cast<size_t>(n * E));
  }
  reserve_layers(n);
  moe_.reserve(n);

  emb_.embed(tokens, x_.data());
  run_layers(n, pos0, cache, hooks);

  // Output head: only the rows whose logits were asked for.
  const int64_t first = mode == LogitsMode::All ? 0 : n - 1;
  const int64_t rows = n - first;
  rmsnorm_rows(x_.data() + first * E, output_norm_.data(), xn_.data(), rows, E, cfg_.rms_eps);
  cpu::matmul(output_, xn_.data(), rows, logits, pool_, mm_, isa_);
  // Only now does the batch become part of the sequence (K/V positions and recurrent state).
  cache.advance(n);
}

}  // namespace moe::model
