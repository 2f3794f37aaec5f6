#include "coordinator/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "common/error.h"
#include "coordinator/engine/worker_pool_experts.h"

namespace moe::engine {

namespace {

JobEvent failed(JobError error, std::string message) {
  JobEvent ev;
  ev.kind = JobEvent::Failed;
  ev.error = error;
  ev.message = std::move(message);
  return ev;
}

}  // namespace

Engine::Engine(model::ModelArch& model, const tokenizer::Tokenizer& tok, EngineOptions opt)
    : model_(model), tok_(tok), opt_(std::move(opt)) {
  if (opt_.n_ctx < 1) throw Error("engine: the context must hold at least one token");
  if (opt_.n_parallel < 1) throw Error("engine: -np must be at least 1");
  if (opt_.n_batch < opt_.n_parallel) {
    throw Error("engine: a batch of " + std::to_string(opt_.n_batch) + " tokens cannot hold one " +
                "token of each of " + std::to_string(opt_.n_parallel) + " slots (raise -ub/-b)");
  }
  stats_.queue_capacity = opt_.queue_capacity;
  stats_.policy = model_.expert_policy();  // before the scheduler starts: no forward runs yet
  fingerprint_ = SlotFingerprint::of(
      model_.config(), model::KvCache(model_.config(), 1, opt_.kv, model::KvStorage::None),
      opt_.weights);
  for (int i = 0; i < opt_.n_parallel; ++i) {
    slots_.push_back(std::make_unique<SequenceSlot>(i, model_, tok_, opt_.n_ctx, opt_.kv,
                                                    opt_.metrics, opt_.context_shift));
  }
  update_slot_stats();
  logits_.resize(static_cast<size_t>(opt_.n_parallel) *
                 static_cast<size_t>(model_.config().n_vocab));
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
  return idle_cv_.wait_until(lock, deadline, [&] { return queue_.empty() && busy_ == 0; });
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mu_);
  EngineStats s = stats_;
  s.queue_depth = queue_.size();
  s.running = busy_;
  s.draining = draining_;
  return s;
}

void Engine::scheduler_loop() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || !probes_.empty() || !slot_tasks_.empty() || !policy_tasks_.empty() ||
               busy_ > 0 || (!queue_.empty() && busy_ < slots_.size());
      });
      if (stop_) break;
    }
    run_probes();
    run_slot_tasks();
    run_policy_tasks();
    admit();
    step();
    update_slot_stats();
    idle_cv_.notify_all();
  }
  // Nobody will run what is left.
  std::deque<std::shared_ptr<Job>> left;
  std::vector<std::shared_ptr<Probe>> probes;
  std::vector<std::shared_ptr<SlotTask>> slot_tasks;
  std::vector<std::shared_ptr<PolicyTask>> policy_tasks;
  {
    std::lock_guard lock(mu_);
    left.swap(queue_);
    probes.swap(probes_);
    slot_tasks.swap(slot_tasks_);
    policy_tasks.swap(policy_tasks_);
  }
  for (auto& slot : slots_) {
    if (slot->busy()) {
      const std::shared_ptr<Job> job = slot->job();
      slot_ended(*slot, job,
                 slot->fail(JobError::Unavailable, "the coordinator is shutting down", true));
    }
  }
  for (auto& j : left) {
    j->push(failed(JobError::Unavailable, "the coordinator is shutting down"));
  }
  for (auto& p : probes) p->result.set_value("the engine is stopping");
  for (auto& t : slot_tasks) {
    t->result.set_value({SlotActionResult::Unavailable, "the server is stopping"});
  }
  for (auto& t : policy_tasks) {
    t->result.set_value({PolicyResult::Unavailable, "the server is stopping"});
  }
  update_slot_stats();
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

SlotActionResult Engine::slot_action(const SlotAction& action) {
  const Clock::time_point t0 = Clock::now();
  using R = SlotActionResult;
  if (action.slot < 0 || action.slot >= opt_.n_parallel) {
    return {R::BadRequest, "no slot " + std::to_string(action.slot) + " (this server has " +
                               std::to_string(opt_.n_parallel) + ": ids 0 to " +
                               std::to_string(opt_.n_parallel - 1) + ")"};
  }
  const auto file_failure = [](const SlotFileError& e) {
    return R{e.kind() == SlotFileError::Invalid    ? R::BadRequest
             : e.kind() == SlotFileError::NotFound ? R::NotFound
                                                   : R::Failed,
             e.what()};
  };
  auto task = std::make_shared<SlotTask>();
  task->kind = action.kind;
  task->slot = action.slot;
  uint64_t bytes = 0;
  if (action.kind == SlotAction::Restore) {
    try {
      SlotContents c = read_slot_file(action.path, fingerprint_, opt_.n_ctx);
      task->tokens = std::move(c.tokens);
      task->image = std::move(c.image);
      bytes = c.bytes;
    } catch (const SlotFileError& e) {
      return file_failure(e);
    }
  }
  std::future<R> done = task->result.get_future();
  {
    std::lock_guard lock(mu_);
    if (stop_) return {R::Unavailable, "the server is stopping"};
    slot_tasks_.push_back(task);
  }
  cv_.notify_all();
  R r = done.get();  // the scheduler answers every task, at the latest when it stops
  if (r.status == R::Ok && action.kind == SlotAction::Save) {
    try {
      bytes = write_slot_file(action.path, fingerprint_, task->tokens, task->image);
    } catch (const SlotFileError& e) {
      return file_failure(e);
    } catch (const std::exception& e) {
      return {R::Failed, e.what()};
    }
  }
  r.n_bytes = bytes;
  r.ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  return r;
}

void Engine::run_slot_tasks() {
  std::vector<std::shared_ptr<SlotTask>> tasks;
  {
    std::lock_guard lock(mu_);
    tasks.swap(slot_tasks_);
  }
  if (tasks.empty()) return;
  std::vector<SlotActionResult> results(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    SlotTask& t = *tasks[i];
    SequenceSlot& slot = *slots_[static_cast<size_t>(t.slot)];
    SlotActionResult& r = results[i];
    if (slot.busy()) {
      r = {SlotActionResult::Busy, "slot " + std::to_string(t.slot) +
                                       " is processing a request; try again once it is idle "
                                       "(GET /slots: is_processing)"};
      continue;
    }
    try {
      switch (t.kind) {
        case SlotAction::Save:
          slot.export_state(t.tokens, t.image);
          r.n_tokens = static_cast<int64_t>(t.tokens.size());
          break;
        case SlotAction::Restore:
          r.n_tokens = static_cast<int64_t>(t.tokens.size());
          slot.import_state(std::move(t.tokens), t.image);
          t.image = {};  // copied in: free it now, not when the caller is done
          break;
        case SlotAction::Erase:
          r.n_tokens = slot.n_cached();
          slot.erase();
          break;
      }
    } catch (const std::exception& e) {
      r = {SlotActionResult::Failed, e.what()};
    }
  }
  // /slots shows the new contents by the time the caller answers.
  update_slot_stats();
  for (size_t i = 0; i < tasks.size(); ++i) tasks[i]->result.set_value(std::move(results[i]));
}

void Engine::admit() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::lock_guard lock(mu_);
      if (queue_.empty() || busy_ >= slots_.size()) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    // The free slot whose cache shares the longest prefix with the prompt (a chat's next turn
    // finds its conversation), else the one unused longest.
    SequenceSlot* best = nullptr;
    size_t best_common = 0;
    for (auto& s : slots_) {
      if (s->busy()) continue;
      const size_t common =
          job->request().cache_prompt ? s->common_prefix(job->request().prompt) : 0;
      if (best == nullptr || common > best_common ||
          (common == best_common && s->last_used() < best->last_used())) {
        best = s.get();
        best_common = common;
      }
    }
    if (job->cancelled()) {
      end_job({}, *job, failed(JobError::Cancelled, "cancelled while queued"));
      continue;
    }
    try {
      if (opt_.prepare) opt_.prepare();
      best->start(job, ++clock_, [this] { return token_bytes(); });
    } catch (const WorkerUnavailable& e) {
      end_job({}, *job, failed(JobError::Unavailable, e.what()));
      continue;
    } catch (const std::exception& e) {
      end_job({}, *job, failed(JobError::Internal, e.what()));
      continue;
    }
    std::lock_guard lock(mu_);
    ++busy_;
  }
}

void Engine::step() {
  // Jobs that end between steps: their caches are consistent and kept.
  for (auto& slot : slots_) {
    if (!slot->busy()) continue;
    const std::shared_ptr<Job> job = slot->job();
    if (stopping_.load(std::memory_order_relaxed)) {
      slot_ended(*slot, job,
                 slot->fail(JobError::Unavailable, "the coordinator is shutting down", true));
    } else if (job->cancelled()) {
      slot_ended(*slot, job, slot->fail(JobError::Cancelled, "cancelled by the client", true));
    }
  }
  // Decoding slots first, one token each, so that a newcomer's long prompt cannot starve them;
  // then prompt chunks in the remaining room, starting with a different slot each step.
  std::vector<model::SequenceChunk> chunks;
  std::vector<SequenceSlot*> members;
  int64_t room = opt_.n_batch;
  for (auto& slot : slots_) {
    if (slot->busy() && !slot->in_prompt()) {
      chunks.push_back({slot->next_tokens(1), &slot->cache()});
      members.push_back(slot.get());
      --room;
    }
  }
  for (size_t i = 0; i < slots_.size() && room > 0; ++i) {
    SequenceSlot& slot = *slots_[(rotate_ + i) % slots_.size()];
    if (!slot.busy() || !slot.in_prompt()) continue;
    const std::span<const int32_t> tokens = slot.next_tokens(room);
    chunks.push_back({tokens, &slot.cache()});
    members.push_back(&slot);
    room -= static_cast<int64_t>(tokens.size());
  }
  rotate_ = (rotate_ + 1) % slots_.size();
  if (chunks.empty()) return;

  try {
    // One sequence alone takes the single-sequence forward (a GPU decode replays its graph).
    if (chunks.size() == 1) {
      model_.forward(chunks[0].tokens, *chunks[0].cache, model::LogitsMode::Last, logits_.data());
    } else {
      model_.forward_batch(chunks, logits_.data());
    }
  } catch (const std::exception& e) {
    const bool worker = dynamic_cast<const WorkerUnavailable*>(&e) != nullptr;
    for (SequenceSlot* slot : members) {
      const std::shared_ptr<Job> job = slot->job();
      // The forward left the caches as they were, but a failure is not trusted: start cold.
      slot_ended(*slot, job,
                 slot->fail(worker ? JobError::Unavailable : JobError::Internal, e.what(), false));
    }
    return;
  }
  const auto n_vocab = static_cast<size_t>(model_.config().n_vocab);
  for (size_t i = 0; i < members.size(); ++i) {
    SequenceSlot& slot = *members[i];
    const std::shared_ptr<Job> job = slot.job();
    try {
      std::optional<JobEvent> end =
          slot.after_forward(std::span<const float>(logits_.data() + i * n_vocab, n_vocab));
      if (end) slot_ended(slot, job, std::move(*end));
    } catch (const std::exception& e) {
      slot_ended(slot, job, slot.fail(JobError::Internal, e.what(), false));
    }
  }
}

void Engine::slot_ended(SequenceSlot& slot, const std::shared_ptr<Job>& job, JobEvent end) {
  end_job(slot.progress(), *job, std::move(end));
  std::lock_guard lock(mu_);
  --busy_;
}

void Engine::end_job(const SequenceSlot::Progress& progress, Job& job, JobEvent end) {
  const JobRequest& req = job.request();
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
  std::optional<model::ExpertPolicy> policy = model_.expert_policy();
  {
    std::lock_guard lock(mu_);
    stats_.experts = experts;
    stats_.policy = policy;
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

void Engine::update_slot_stats() {
  std::vector<SlotStats> v;
  v.reserve(slots_.size());
  for (const auto& s : slots_) v.push_back({s->id(), s->n_ctx(), s->busy(), s->n_cached()});
  std::lock_guard lock(mu_);
  stats_.slots = std::move(v);
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

}  // namespace moe::engine
