#include "coordinator/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"
#include "coordinator/engine/stop_matcher.h"
#include "coordinator/engine/worker_pool_experts.h"
#include "coordinator/sampling/sampler.h"
#include "coordinator/tokenizer/stream_detokenizer.h"

namespace moe::engine {

namespace {

double ms_since(Clock::time_point t0, Clock::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

// Thrown between tokens when the job was cancelled or the engine stops.
struct Interrupted {
  JobError error;
  std::string message;
};

}  // namespace

Engine::Engine(model::ModelArch& model, const tokenizer::Tokenizer& tok, EngineOptions opt)
    : model_(model), tok_(tok), opt_(std::move(opt)) {
  if (opt_.n_ctx < 1) throw Error("engine: the context must hold at least one token");
  if (opt_.n_batch < 1) throw Error("engine: the batch must hold at least one token");
  stats_.queue_capacity = opt_.queue_capacity;
  logits_.resize(static_cast<size_t>(model_.config().n_vocab));
  scheduler_ = std::thread([this] { scheduler_loop(); });
}

void Engine::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  stopping_.store(true);
  cv_.notify_all();
  if (scheduler_.joinable()) scheduler_.join();
}

Engine::~Engine() { stop(); }

Engine::Admit Engine::submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard lock(mu_);
    if (draining_ || stop_) return Admit::Draining;
    if (queue_.size() >= opt_.queue_capacity) {
      ++stats_.rejected;
      return Admit::QueueFull;
    }
    queue_.push_back(std::move(job));
    ++stats_.accepted;
  }
  cv_.notify_all();
  return Admit::Ok;
}

std::string Engine::probe(std::chrono::milliseconds timeout) {
  auto p = std::make_shared<Probe>();
  std::future<std::string> result = p->result.get_future();
  {
    std::lock_guard lock(mu_);
    if (stop_) return "the engine is stopping";
    probes_.push_back(p);
  }
  cv_.notify_all();
  if (result.wait_for(timeout) != std::future_status::ready) {
    return "no answer from the scheduler within " + std::to_string(timeout.count()) + " ms";
  }
  return result.get();
}

bool Engine::drain(Clock::time_point deadline) {
  std::unique_lock lock(mu_);
  draining_ = true;
  return idle_cv_.wait_until(lock, deadline, [&] { return queue_.empty() && !busy_; });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  EngineStats s = stats_;
  s.queue_depth = queue_.size();
  s.running = busy_ ? 1 : 0;
  s.draining = draining_;
  return s;
}

void Engine::scheduler_loop() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty() || !probes_.empty(); });
      if (stop_) break;
      if (!queue_.empty()) {
        job = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
    }
    run_probes();
    if (job) {
      run_job(*job);
      {
        std::lock_guard lock(mu_);
        busy_ = false;
      }
      idle_cv_.notify_all();
    }
  }
  // Nobody will run what is left.
  std::deque<std::shared_ptr<Job>> left;
  std::vector<std::shared_ptr<Probe>> probes;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
    probes.swap(probes_);
  }
  for (auto& j : left) {
    JobEvent ev;
    ev.kind = JobEvent::Failed;
    ev.error = JobError::Unavailable;
    ev.message = "the coordinator is shutting down";
    j->push(std::move(ev));
  }
  for (auto& p : probes) p->result.set_value("the engine is stopping");
  idle_cv_.notify_all();
}

void Engine::run_probes() {
  std::vector<std::shared_ptr<Probe>> probes;
  {
    std::lock_guard lock(mu_);
    probes.swap(probes_);
  }
  if (probes.empty()) return;
  std::string why;
  try {
    if (opt_.prepare) opt_.prepare();
    // A scratch sequence of its own: whatever is running keeps its cache untouched.
    if (!probe_cache_) probe_cache_.emplace(model_.make_cache(1, opt_.kv));
    model::KvCache& cache = *probe_cache_;
    cache.clear();
    const int32_t token = tok_.bos_id() >= 0 ? tok_.bos_id() : 0;
    // Its own logits too: a running job's row may not have been sampled yet.
    std::vector<float> logits(logits_.size());
    model_.forward(std::span<const int32_t>(&token, 1), cache, model::LogitsMode::Last,
                   logits.data());
    if (!std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); })) {
      why = "the one-token step produced non-finite logits";
    }
  } catch (const std::exception& e) {
    why = e.what();
  }
  for (auto& p : probes) p->result.set_value(why);
}

void Engine::run_job(Job& job) {
  const JobRequest& req = job.request();
  JobEvent end;
  uint32_t seed = 0;
  Progress progress;
  try {
    if (job.cancelled()) throw Interrupted{JobError::Cancelled, "cancelled while queued"};
    end = generate(job, &seed, &progress);
  } catch (const Interrupted& i) {
    end = JobEvent{};
    end.kind = JobEvent::Failed;
    end.error = i.error;
    end.message = i.message;
  } catch (const WorkerUnavailable& e) {
    end = JobEvent{};
    end.kind = JobEvent::Failed;
    end.error = JobError::Unavailable;
    end.message = e.what();
  } catch (const std::exception& e) {
    end = JobEvent{};
    end.kind = JobEvent::Failed;
    end.error = JobError::Internal;
    end.message = e.what();
  }
  // A cancelled job's cache is consistent (the cancel is seen between forwards); after anything
  // else the next job starts cold rather than trust it.
  if (end.kind == JobEvent::Failed && end.error != JobError::Cancelled && slot_.cache) {
    slot_.cache->clear();
    slot_.tokens.clear();
  }
  if (opt_.metrics != nullptr) {
    const auto outcome = end.kind == JobEvent::Finish       ? MetricsSink::Outcome::Ok
                         : end.error == JobError::Cancelled ? MetricsSink::Outcome::Cancelled
                                                            : MetricsSink::Outcome::Failed;
    // What was computed, however the job ended: a stream the client closed midway still cost
    // its tokens.
    opt_.metrics->job_end(outcome, progress.prompt_tokens, progress.cached_tokens,
                          progress.generated_tokens);
  }
  std::optional<model::ExpertRuntimeStats> experts = model_.expert_runtime();
  {
    std::lock_guard lock(mu_);
    stats_.experts = experts;
    if (end.kind == JobEvent::Finish) {
      ++stats_.completed;
      stats_.prompt_tokens += static_cast<uint64_t>(req.prompt.size());
      stats_.generated_tokens += static_cast<uint64_t>(end.completion_tokens);
      stats_.prompt_ms += end.timings.prompt_ms;
      stats_.generation_ms += end.timings.generation_ms;
      if (end.timings.generation_ms > 0 && end.timings.decode_steps > 0) {
        stats_.last_tokens_per_second =
            1e3 * static_cast<double>(end.timings.decode_steps) / end.timings.generation_ms;
      }
    } else if (end.error == JobError::Cancelled) {
      ++stats_.cancelled;
    } else {
      ++stats_.failed;
    }
  }
  job.push(std::move(end));
}

const std::shared_ptr<const grammar::TokenBytes>& Engine::token_bytes() {
  if (!token_bytes_) {
    const int32_t n = tok_.n_vocab();
    std::vector<std::string> bytes(static_cast<size_t>(n));
    std::vector<grammar::TokenBytes::Kind> kinds(static_cast<size_t>(n));
    for (int32_t id = 0; id < n; ++id) {
      const auto type = tok_.vocab().type(id);
      // Control tokens (<|im_start|>, ...) are structure, not text; user-defined ones such as
      // Qwen's <tool_call> are text the grammar may spell.
      kinds[static_cast<size_t>(id)] =
          tok_.is_eog(id) ? grammar::TokenBytes::Kind::Eog
          : type == tokenizer::TokenType::kControl || type == tokenizer::TokenType::kUnused
              ? grammar::TokenBytes::Kind::Never
              : grammar::TokenBytes::Kind::Text;
      if (kinds[static_cast<size_t>(id)] == grammar::TokenBytes::Kind::Text) {
        bytes[static_cast<size_t>(id)] = tok_.token_piece(id, true);
      }
    }
    token_bytes_ = std::make_shared<grammar::TokenBytes>(std::move(bytes), std::move(kinds));
  }
  return token_bytes_;
}

JobEvent Engine::generate(Job& job, uint32_t* seed_out, Progress* progress) {
  const JobRequest& req = job.request();
  const Clock::time_point t_start = Clock::now();
  auto check = [&] {
    if (job.cancelled()) throw Interrupted{JobError::Cancelled, "cancelled by the client"};
    if (stopping_.load(std::memory_order_relaxed)) {
      throw Interrupted{JobError::Unavailable, "the coordinator is shutting down"};
    }
  };
  if (opt_.prepare) opt_.prepare();

  const auto n_prompt = static_cast<int64_t>(req.prompt.size());
  if (n_prompt < 1 || n_prompt > opt_.n_ctx) {
    throw Error("prompt of " + std::to_string(n_prompt) + " tokens for a context of " +
                std::to_string(opt_.n_ctx));
  }
  // Only the positions this job can use: n tokens need n_prompt + n - 1 of them.
  int64_t n_ctx = opt_.n_ctx;
  if (req.max_tokens > 0) n_ctx = std::min(n_ctx, n_prompt + req.max_tokens - 1);
  n_ctx = std::max(n_ctx, n_prompt);
  if (!slot_.cache) slot_.cache.emplace(model_.make_cache(opt_.n_ctx, opt_.kv));
  model::KvCache& cache = *slot_.cache;
  // The prompt cache: keep the common prefix of the cached tokens and the prompt, but evaluate at
  // least the last prompt token (its logits choose the first new token).
  int64_t reuse = 0;
  if (req.cache_prompt) {
    const size_t common =
        static_cast<size_t>(std::mismatch(slot_.tokens.begin(), slot_.tokens.end(),
                                          req.prompt.begin(), req.prompt.end())
                                .first -
                            slot_.tokens.begin());
    reuse = std::min<int64_t>(static_cast<int64_t>(common), n_prompt - 1);
    if (!cache.can_truncate_to(reuse)) {
      // A recurrent state cannot be rewound: back to the checkpoint if it lies in the prefix.
      const int64_t c = cache.checkpoint_pos();
      reuse = c >= 0 && c <= reuse && model_.restore_checkpoint(cache) ? c : 0;
    }
  }
  cache.truncate(reuse);
  slot_.tokens.resize(static_cast<size_t>(reuse));
  progress->cached_tokens = reuse;

  sampling::DryVocab dry_vocab;
  dry_vocab.piece = [this](int32_t id) { return tok_.token_piece(id, true); };
  dry_vocab.tokenize = [this](std::string_view s) { return tok_.encode(s, true); };
  sampling::Sampler sampler(req.sampling, tok_.n_vocab(), &dry_vocab);
  sampler.set_logprobs(req.top_logprobs);
  *seed_out = sampler.seed();
  std::optional<grammar::GrammarMatcher> grammar;
  if (req.grammar) grammar.emplace(req.grammar, token_bytes());
  for (int32_t t : req.prompt) sampler.accept(t);

  // The rest of the prompt in batches, checking for cancellation and serving probes between
  // them.
  // A hybrid model keeps a checkpoint just before the prompt's last token: a later prompt that
  // shares this one (a chat's next turn, the same prompt again) resumes there.
  const bool hybrid = model_.config().has_recurrent();
  for (int64_t i = reuse; i < n_prompt;) {
    check();
    const int64_t end = hybrid && i < n_prompt - 1 ? n_prompt - 1 : n_prompt;
    const int64_t n = std::min(opt_.n_batch, end - i);
    model_.forward(std::span<const int32_t>(req.prompt.data() + i, static_cast<size_t>(n)), cache,
                   model::LogitsMode::Last, logits_.data());
    slot_.tokens.insert(slot_.tokens.end(), req.prompt.begin() + i, req.prompt.begin() + i + n);
    i += n;
    progress->prompt_tokens = i - reuse;
    if (hybrid && i == n_prompt - 1 && cache.checkpoint_pos() != i) model_.save_checkpoint(cache);
    if (i < n_prompt) run_probes();
  }
  const Clock::time_point t_prompt = Clock::now();

  tokenizer::StreamDetokenizer detok(tok_);
  StopMatcher stops(req.stop);
  JobEvent fin;
  fin.kind = JobEvent::Finish;
  fin.prompt_tokens = n_prompt;
  fin.cached_tokens = reuse;
  fin.seed = sampler.seed();
  int64_t n_gen = 0, steps = 0;
  Clock::time_point t_last_token = t_prompt;
  auto emit = [&](std::vector<int32_t> tokens, std::string text) {
    if (tokens.empty() && text.empty()) return;
    JobEvent ev;
    if (req.top_logprobs >= 0 && !tokens.empty()) ev.logprobs.push_back(sampler.last_logprobs());
    ev.tokens = std::move(tokens);
    ev.text = std::move(text);
    job.push(std::move(ev));
  };
  for (;;) {
    check();
    const int32_t token =
        sampler.sample(logits_, grammar ? grammar->allowed() : std::span<const uint64_t>{});
    sampler.accept(token);
    if (grammar && !tok_.is_eog(token)) grammar->accept(token);
    ++n_gen;
    progress->generated_tokens = n_gen;
    if (opt_.metrics != nullptr) {
      const Clock::time_point now = Clock::now();
      if (n_gen == 1) {
        opt_.metrics->first_token(std::chrono::duration<double>(now - job.accepted()).count());
      } else {
        opt_.metrics->token_gap(std::chrono::duration<double>(now - t_last_token).count());
      }
      t_last_token = now;
    }
    if (tok_.is_eog(token) && !req.ignore_eos) {
      fin.reason = FinishReason::Eog;
      break;
    }
    const StopMatcher::Step step = stops.push(detok.push(token));
    emit({token}, step.release);
    if (step.stop) {
      fin.reason = FinishReason::StopString;
      fin.stop_string = *step.stop;
      break;
    }
    // A complete grammar allows only the end: stop here rather than spend a forward on it.
    if (grammar && grammar->must_end()) {
      fin.reason = FinishReason::Eog;
      break;
    }
    if (req.max_tokens > 0 && n_gen >= req.max_tokens) {
      fin.reason = FinishReason::Length;
      break;
    }
    if (cache.n_past() >= n_ctx) {
      fin.reason = FinishReason::Context;
      break;
    }
    run_probes();
    check();
    model_.forward(std::span<const int32_t>(&token, 1), cache, model::LogitsMode::Last,
                   logits_.data());
    slot_.tokens.push_back(token);
    ++steps;
  }
  if (fin.reason != FinishReason::StopString) {
    const StopMatcher::Step tail = stops.push(detok.finish());
    std::string text = tail.release;
    if (tail.stop) {
      fin.reason = FinishReason::StopString;
      fin.stop_string = *tail.stop;
    } else {
      text += stops.flush();
    }
    emit({}, std::move(text));
  }
  const Clock::time_point t_end = Clock::now();
  fin.completion_tokens = n_gen;
  fin.timings.queue_ms = ms_since(job.accepted(), t_start);
  fin.timings.prompt_ms = ms_since(t_start, t_prompt);
  fin.timings.generation_ms = ms_since(t_prompt, t_end);
  fin.timings.decode_steps = steps;
  return fin;
}

}  // namespace moe::engine
