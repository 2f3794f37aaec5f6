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
                                                                  pool_, isa_, cfg_.expert_act));
}

void CpuForward::reserve(int64_t n) {
  const auto rows = static_cast<size_t>(n * cfg_.n_embd);
  if (x_.size() < rows) {
    x_.resize(rows);
    xn_.resize(rows);
  }
  reserve_layers(n);
  moe_.reserve(n);
}

void CpuForward::forward(std::span<const int32_t> tokens, KvCache& cache, LogitsMode mode,
                         float* logits, const ForwardHooks* hooks) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t E = cfg_.n_embd;
  check_tokens(tokens, cfg_.n_vocab);
  cache.check_room(n);
  check_cache(cache);
  reserve(n);

  if (prof_ && prof_->active()) prof_->count_tokens(n);
  {
    const OpTimer timer(prof_, Op::kEmbed);
    emb_.embed(tokens, x_.data());
  }
  const SequenceRows seq{0, n, cache.n_past(), &cache};
  run_layers(n, std::span<const SequenceRows>(&seq, 1), hooks);

  // Output head: only the rows whose logits were asked for (every row normed for a hook that
  // observes them).
  const bool observe = hooks && hooks->observe_hidden;
  const int64_t first = mode == LogitsMode::All ? 0 : n - 1;
  const int64_t rows = n - first, normed = observe ? n : rows;
  const OpTimer timer(prof_, Op::kOutput, weight_bytes(output_));
  rmsnorm_rows(x_.data() + (n - normed) * E, output_norm_.data(), xn_.data(), normed, E,
               cfg_.rms_eps);
  cpu::matmul(output_, xn_.data() + (normed - rows) * E, rows, logits, pool_, mm_, isa_);
  // After the head: the observer may run a forward of its own (the MTP block) on this scratch.
  if (observe) hooks->observe_hidden(tokens, cache.n_past(), xn_.data());
  // Only now does the batch become part of the sequence (K/V positions and recurrent state).
  cache.advance(n);
}

void CpuForward::forward_batch(std::span<const SequenceChunk> chunks, float* logits) {
  const int64_t n = check_chunks(chunks, cfg_.n_vocab);
  for (const SequenceChunk& c : chunks) check_cache(*c.cache);
  const int64_t E = cfg_.n_embd;
  reserve(n);

  // Chunk i's rows follow chunk i-1's.
  seqs_.clear();
  int64_t row0 = 0;
  for (const SequenceChunk& c : chunks) {
    const auto m = static_cast<int64_t>(c.tokens.size());
    seqs_.push_back({row0, m, c.cache->n_past(), c.cache});
    emb_.embed(c.tokens, x_.data() + row0 * E);
    row0 += m;
  }
  run_layers(n, seqs_, nullptr);

  // Output head over the chunks' last rows only, gathered into xn_ as one small batch (every
  // chunk has a row, so xn_ holds them).
  const auto n_seq = static_cast<int64_t>(seqs_.size());
  for (int64_t i = 0; i < n_seq; ++i) {
    const SequenceRows& s = seqs_[static_cast<size_t>(i)];
    rmsnorm_rows(x_.data() + (s.row0 + s.n - 1) * E, output_norm_.data(), xn_.data() + i * E, 1, E,
                 cfg_.rms_eps);
  }
  cpu::matmul(output_, xn_.data(), n_seq, logits, pool_, mm_, isa_);
  // Only now do the chunks become part of their sequences: a throw above left every cache as it
  // was, and advance cannot fail (each cache's room was checked).
  for (const SequenceRows& s : seqs_) s.cache->advance(s.n);
}

}  // namespace moe::model
