#include "coordinator/engine/sequence_slot.h"

#include <algorithm>

#include "common/error.h"

namespace moe::engine {
namespace {

double ms_between(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// DRY's sequence breakers map text to tokens.
sampling::DryVocab dry_vocab(const tokenizer::Tokenizer& tok) {
  sampling::DryVocab v;
  v.piece = [&tok](int32_t id) { return tok.token_piece(id, true); };
  v.tokenize = [&tok](std::string_view s) { return tok.encode(s, true); };
  return v;
}

}  // namespace

struct SequenceSlot::Running {
  Running(const JobRequest& req, const tokenizer::Tokenizer& tok)
      : vocab(dry_vocab(tok)),
        sampler(req.sampling, tok.n_vocab(), &vocab),
        detok(tok),
        stops(req.stop) {}

  sampling::DryVocab vocab;  // before the sampler, which keeps a pointer to it
  sampling::Sampler sampler;
  std::optional<grammar::GrammarMatcher> grammar;
  tokenizer::StreamDetokenizer detok;
  StopMatcher stops;
  Clock::time_point t_start, t_prompt, t_last_token;
  int64_t n_gen = 0, steps = 0;
};

SequenceSlot::SequenceSlot(int id, model::ModelArch& model, const tokenizer::Tokenizer& tok,
                           int64_t n_ctx, const model::KvConfig& kv, MetricsSink* metrics,
                           bool context_shift)
    : id_(id),
      model_(model),
      tok_(tok),
      n_ctx_(n_ctx),
      kv_(kv),
      metrics_(metrics),
      context_shift_(context_shift) {}

SequenceSlot::~SequenceSlot() = default;

model::KvCache& SequenceSlot::cache() {
  if (!cache_) cache_.emplace(model_.make_cache(n_ctx_, kv_));
  return *cache_;
}

size_t SequenceSlot::common_prefix(const std::vector<int32_t>& prompt) const {
  return static_cast<size_t>(
      std::mismatch(tokens_.begin(), tokens_.end(), prompt.begin(), prompt.end()).first -
      tokens_.begin());
}

void SequenceSlot::start(
    std::shared_ptr<Job> job, uint64_t now,
    const std::function<std::shared_ptr<const grammar::TokenBytes>()>& token_bytes) {
  const JobRequest& req = job->request();
  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  if (n_prompt < 1 || n_prompt > n_ctx_) {
    throw Error("prompt of " + std::to_string(n_prompt) + " tokens for a context of " +
                std::to_string(n_ctx_) + (n_ctx_ > 0 ? " per slot" : ""));
  }
  auto run = std::make_unique<Running>(req, tok_);
  run->t_start = Clock::now();
  run->sampler.set_logprobs(req.top_logprobs);
  if (req.grammar) run->grammar.emplace(req.grammar, token_bytes());
  for (int32_t t : req.prompt) run->sampler.accept(t);

  model::KvCache& kv = cache();
  // The prompt cache: keep the common prefix of the cached tokens and the prompt, but evaluate at
  // least the last prompt token (its logits choose the first new token).
  int64_t reuse = 0;
  if (req.cache_prompt) {
    reuse = std::min<int64_t>(static_cast<int64_t>(common_prefix(req.prompt)), n_prompt - 1);
    if (!kv.can_truncate_to(reuse)) {
      // A recurrent state or a ring cannot go back that far: back to the checkpoint if it lies in
      // the prefix.
      const int64_t c = kv.checkpoint_pos();
      reuse = c >= 0 && c <= reuse && model_.restore_checkpoint(kv) ? c : 0;
    }
  }
  kv.truncate(reuse);
  tokens_.resize(static_cast<size_t>(reuse));

  // Only the positions this job can use: n tokens need n_prompt + n - 1 of them. Reaching
  // n_ctx_job_ below n_ctx_ means max_tokens is reached too, so a context shift happens only at
  // n_ctx_ (and a job may then generate past it, up to its max_tokens).
  n_ctx_job_ = n_ctx_;
  if (req.max_tokens > 0) n_ctx_job_ = std::min(n_ctx_job_, n_prompt + req.max_tokens - 1);
  n_ctx_job_ = std::max(n_ctx_job_, n_prompt);
  next_prompt_ = reuse;
  pending_ = -1;
  progress_ = Progress{0, reuse, 0};
  last_used_ = now;
  run_ = std::move(run);
  job_ = std::move(job);
}

std::span<const int32_t> SequenceSlot::next_tokens(int64_t budget) {
  if (!in_prompt()) return {&pending_, 1};
  const auto n_prompt = static_cast<int64_t>(prompt().size());
  // A cache that cannot go back far (a recurrent state, sliding-window rings) keeps a checkpoint
  // just before the prompt's last token: a later prompt that shares this one (a chat's next turn,
  // the same prompt again) resumes there.
  const bool checkpointed = cache_->needs_checkpoints();
  const int64_t end = checkpointed && next_prompt_ < n_prompt - 1 ? n_prompt - 1 : n_prompt;
  const int64_t n = std::min(budget, end - next_prompt_);
  return {prompt().data() + next_prompt_, static_cast<size_t>(n)};
}

std::optional<JobEvent> SequenceSlot::after_forward(std::span<const float> logits) {
  Running& r = *run_;
  const JobRequest& req = job_->request();
  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  if (in_prompt()) {
    // The chunk next_tokens() gave: the cache advanced by exactly its length.
    const int64_t n = cache_->n_past() - static_cast<int64_t>(tokens_.size());
    tokens_.insert(tokens_.end(), req.prompt.begin() + next_prompt_,
                   req.prompt.begin() + next_prompt_ + n);
    next_prompt_ += n;
    progress_.prompt_tokens = next_prompt_ - progress_.cached_tokens;
    if (cache_->needs_checkpoints() && next_prompt_ == n_prompt - 1 &&
        cache_->checkpoint_pos() != next_prompt_) {
      model_.save_checkpoint(*cache_);
    }
    if (in_prompt()) return std::nullopt;
    r.t_prompt = r.t_last_token = Clock::now();
  } else {
    tokens_.push_back(pending_);
    ++r.steps;
  }

  const int32_t token =
      r.sampler.sample(logits, r.grammar ? r.grammar->allowed() : std::span<const uint64_t>{});
  r.sampler.accept(token);
  if (r.grammar && !tok_.is_eog(token)) r.grammar->accept(token);
  ++r.n_gen;
  progress_.generated_tokens = r.n_gen;
  if (metrics_ != nullptr) {
    const Clock::time_point now = Clock::now();
    if (r.n_gen == 1) {
      metrics_->first_token(std::chrono::duration<double>(now - job_->accepted()).count());
    } else {
      metrics_->token_gap(std::chrono::duration<double>(now - r.t_last_token).count());
    }
    r.t_last_token = now;
  }
  if (tok_.is_eog(token) && !req.ignore_eos) {
    JobEvent fin = finish(FinishReason::Eog, {});
    fin.end_token = token;  // harmony's <|call|> / <|return|> close what the reply parser holds
    return fin;
  }
  const StopMatcher::Step step = r.stops.push(r.detok.push(token));
  JobEvent ev;
  if (req.top_logprobs >= 0) ev.logprobs.push_back(r.sampler.last_logprobs());
  ev.tokens = {token};
  ev.text = step.release;
  job_->push(std::move(ev));
  if (step.stop) return finish(FinishReason::StopString, *step.stop);
  // A complete grammar allows only the end: stop here rather than spend a forward on it.
  if (r.grammar && r.grammar->must_end()) return finish(FinishReason::Eog, {});
  if (req.max_tokens > 0 && r.n_gen >= req.max_tokens) return finish(FinishReason::Length, {});
  if (cache_->n_past() >= n_ctx_job_ && !shift_context()) {
    return finish(FinishReason::Context, {});
  }
  pending_ = token;
  return std::nullopt;
}

bool SequenceSlot::shift_context() {
  if (!context_shift_ || model_.config().has_recurrent()) return false;
  // As llama-server: the request's n_keep (-1: the whole prompt), one more for a BOS the
  // tokenizer added, at most the prompt; half of the rest goes.
  const JobRequest& req = job_->request();
  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  int64_t n_keep = req.n_keep < 0 ? n_prompt : req.n_keep;
  if (req.n_keep >= 0 && tok_.add_bos() && req.prompt.front() == tok_.bos_id()) ++n_keep;
  n_keep = std::min(n_keep, n_prompt);
  const int64_t n_discard = (cache_->n_past() - n_keep) / 2;
  if (n_discard < 1) return false;
  model_.shift_context(*cache_, n_keep, n_discard);
  tokens_.erase(tokens_.begin() + n_keep, tokens_.begin() + n_keep + n_discard);
  // The moved rows were computed beside tokens that are gone: no later prompt may reuse them.
  exact_prefix_ = exact_prefix_ < 0 ? n_keep : std::min(exact_prefix_, n_keep);
  return true;
}

JobEvent SequenceSlot::finish(FinishReason reason, std::string stop_string) {
  Running& r = *run_;
  const JobRequest& req = job_->request();
  JobEvent fin;
  fin.kind = JobEvent::Finish;
  fin.reason = reason;
  fin.stop_string = std::move(stop_string);
  if (reason != FinishReason::StopString) {
    const StopMatcher::Step tail = r.stops.push(r.detok.finish());
    std::string text = tail.release;
    if (tail.stop) {
      fin.reason = FinishReason::StopString;
      fin.stop_string = *tail.stop;
    } else {
      text += r.stops.flush();
    }
    if (!text.empty()) {
      JobEvent ev;
      ev.text = std::move(text);
      job_->push(std::move(ev));
    }
  }
  const Clock::time_point t_end = Clock::now();
  fin.prompt_tokens = static_cast<int64_t>(req.prompt.size());
  fin.cached_tokens = progress_.cached_tokens;
  fin.completion_tokens = r.n_gen;
  fin.seed = r.sampler.seed();
  fin.timings.queue_ms = ms_between(job_->accepted(), r.t_start);
  fin.timings.prompt_ms = ms_between(r.t_start, r.t_prompt);
  fin.timings.generation_ms = ms_between(r.t_prompt, t_end);
  fin.timings.decode_steps = r.steps;
  release();
  return fin;
}

JobEvent SequenceSlot::fail(JobError error, std::string message, bool keep_cache) {
  if (!keep_cache && cache_) {
    cache_->clear();
    tokens_.clear();
  }
  JobEvent ev;
  ev.kind = JobEvent::Failed;
  ev.error = error;
  ev.message = std::move(message);
  release();
  return ev;
}

void SequenceSlot::export_state(std::vector<int32_t>& tokens, model::SequenceImage& image) {
  if (busy()) throw Error("slot " + std::to_string(id_) + " is busy");
  model_.export_sequence(cache(), image);
  tokens = tokens_;
}

void SequenceSlot::import_state(std::vector<int32_t> tokens, const model::SequenceImage& image) {
  if (busy()) throw Error("slot " + std::to_string(id_) + " is busy");
  if (static_cast<int64_t>(tokens.size()) != image.n_past) {
    throw Error("slot state of " + std::to_string(image.n_past) + " positions for " +
                std::to_string(tokens.size()) + " tokens");
  }
  model::KvCache& kv = cache();
  try {
    model_.import_sequence(kv, image);
  } catch (...) {
    // Refused before copying: the cache is as it was. Failed while copying: it is empty.
    if (kv.n_past() != n_cached()) erase();
    throw;
  }
  tokens_ = std::move(tokens);
}

void SequenceSlot::erase() {
  if (busy()) throw Error("slot " + std::to_string(id_) + " is busy");
  if (cache_) cache_->clear();
  tokens_.clear();
}

void SequenceSlot::release() {
  if (exact_prefix_ >= 0 && cache_ && cache_->n_past() > exact_prefix_) {
    cache_->truncate(exact_prefix_);
    tokens_.resize(static_cast<size_t>(exact_prefix_));
  }
  exact_prefix_ = -1;
  run_.reset();
  job_.reset();
  pending_ = -1;
}

}  // namespace moe::engine
