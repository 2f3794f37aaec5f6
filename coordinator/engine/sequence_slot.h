// One of the engine's -np sequences (llama-server's slots): its KV cache (and recurrent state)
// with the tokens it holds, kept after a request ends (the prompt cache), and the request running
// in it: where its prompt stands, its sampler, grammar, detokenizer and stop strings. The engine's
// scheduler asks each busy slot for its next tokens, evaluates every slot's tokens in one forward,
// and hands each slot its row of logits; the slot samples, streams chunks into its job and says
// when the job has ended. Scheduler thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "coordinator/engine/job.h"
#include "coordinator/engine/metrics_sink.h"
#include "coordinator/engine/stop_matcher.h"
#include "coordinator/grammar/grammar.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/sampling/sampler.h"
#include "coordinator/tokenizer/stream_detokenizer.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace moe::engine {

class SequenceSlot {
 public:
  // Tokens a job got through, kept up to date as it runs so that the work of a job that is
  // cancelled or fails midway is counted too.
  struct Progress {
    int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  };

  // `model` and `tok` must outlive the slot; the cache (n_ctx positions) is made at the first job.
  // `context_shift`: a full context drops older tokens and generation goes on
  // (EngineOptions::context_shift).
  SequenceSlot(int id, model::ModelArch& model, const tokenizer::Tokenizer& tok, int64_t n_ctx,
               const model::KvConfig& kv, MetricsSink* metrics, bool context_shift = false);
  ~SequenceSlot();
  SequenceSlot(const SequenceSlot&) = delete;
  SequenceSlot& operator=(const SequenceSlot&) = delete;

  int id() const { return id_; }
  int64_t n_ctx() const { return n_ctx_; }
  bool busy() const { return job_ != nullptr; }
  const std::shared_ptr<Job>& job() const { return job_; }
  // Positions the cache holds (the prompt cache, between requests).
  int64_t n_cached() const { return static_cast<int64_t>(tokens_.size()); }
  // Leading tokens of `prompt` this slot's cache holds: the engine gives a job to the free slot
  // that shares the most with it.
  size_t common_prefix(const std::vector<int32_t>& prompt) const;
  // A counter value from the engine when the slot last took a job (least recently used first).
  uint64_t last_used() const { return last_used_; }

  // Takes `job`: checks its prompt against the context, keeps the longest usable common prefix
  // of the cache (cache_prompt) and sets up its sampling. Throws moe::Error (the job is not
  // taken) on a prompt that does not fit. `token_bytes` is the vocabulary for a grammar (called
  // only when the job has one).
  void start(std::shared_ptr<Job> job, uint64_t now,
             const std::function<std::shared_ptr<const grammar::TokenBytes>()>& token_bytes);

  // The tokens this slot wants evaluated in the next forward: its prompt's next chunk of at most
  // `budget` tokens (a hybrid model's chunk stops before the prompt's last token, where the
  // prompt cache keeps a checkpoint), or the token it sampled last. Busy slots only.
  std::span<const int32_t> next_tokens(int64_t budget);
  bool in_prompt() const { return next_prompt_ < static_cast<int64_t>(prompt().size()); }

  // After a forward evaluated next_tokens(): `logits` is the last token's row. In the prompt the
  // slot moves on (and keeps a checkpoint where due); once the prompt is done it samples, streams
  // the token into the job and checks the end conditions. Returns the end event when the job has
  // ended (the slot is free again and keeps its cache), else nothing.
  std::optional<JobEvent> after_forward(std::span<const float> logits);

  // Ends the running job with an error and frees the slot. `keep_cache`: the cache is consistent
  // (a cancel seen between forwards); otherwise the next job starts cold.
  JobEvent fail(JobError error, std::string message, bool keep_cache);

  const Progress& progress() const { return progress_; }
  model::KvCache& cache();

  // Slot files (Engine::slot_action), on a free slot only (moe::Error otherwise): the tokens the
  // cache holds and its state copied out; tokens and state copied in (the cache as it was when the
  // model refuses the state before copying, else empty); the cache emptied.
  void export_state(std::vector<int32_t>& tokens, model::SequenceImage& image);
  void import_state(std::vector<int32_t> tokens, const model::SequenceImage& image);
  void erase();

 private:
  struct Running;  // the job's sampling state
  const std::vector<int32_t>& prompt() const { return job_->request().prompt; }
  JobEvent finish(FinishReason reason, std::string stop_string);
  // Makes room in a full context by a context shift; false when off or impossible.
  bool shift_context();
  void release();

  int id_;
  model::ModelArch& model_;
  const tokenizer::Tokenizer& tok_;
  int64_t n_ctx_;
  model::KvConfig kv_;
  MetricsSink* metrics_;
  std::optional<model::KvCache> cache_;
  std::vector<int32_t> tokens_;  // exactly the cache's n_past() tokens
  bool context_shift_;
  // After a context shift in the running job: the leading positions whose rows still equal a cold
  // evaluation of their tokens (the prompt cache keeps only those); -1: no shift.
  int64_t exact_prefix_ = -1;
  uint64_t last_used_ = 0;

  std::shared_ptr<Job> job_;
  std::unique_ptr<Running> run_;
  int64_t next_prompt_ = 0;  // prompt tokens evaluated (cached ones included)
  int64_t n_ctx_job_ = 0;    // positions this job may use
  int32_t pending_ = -1;     // sampled, streamed, not yet evaluated
  Progress progress_;
};

}  // namespace moe::engine
