// One generation request inside the coordinator, shared by the RPC thread that accepted it and the
// engine's scheduler thread that runs it. The scheduler pushes events (chunks, then one end event)
// into the job; the RPC thread waits for them and forwards them to the client. Either side may
// give up: the RPC thread by cancel() (stream closed, deadline), the scheduler by an end event.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/grammar/grammar.h"
#include "coordinator/sampling/sampler.h"
#include "coordinator/sampling/sampler_params.h"

namespace moe::engine {

using Clock = std::chrono::steady_clock;

// A validated request: the prompt is already token ids.
struct JobRequest {
  std::vector<int32_t> prompt;
  sampling::SamplingParams sampling;
  int64_t max_tokens = 0;  // 0: until end of generation or the context is full
  std::vector<std::string> stop;
  bool ignore_eos = false;
  // Reuse the prompt cache (the previous job's sequence) for the prompt's common prefix
  // (llama-server's cache_prompt; the logits match a cold evaluation within rounding).
  bool cache_prompt = true;
  // Constrained output: the generated text is a sentence of this grammar (null: free text).
  std::shared_ptr<const grammar::Grammar> grammar;
  // -1: no log-probabilities; 0..20: each chunk carries its tokens' and this many alternatives'.
  int top_logprobs = -1;
  // Context shift (--context-shift): prompt tokens kept at the start when a full context drops
  // older ones (-1: the whole prompt; clamped to the prompt).
  int64_t n_keep = 0;
};

enum class FinishReason { Eog, Length, StopString, Context };

struct JobTimings {
  double queue_ms = 0, prompt_ms = 0, generation_ms = 0;
  int64_t decode_steps = 0;  // single-token forwards (the first token comes from the prompt)
};

// How a job ended when it did not finish normally; maps onto gRPC status codes.
enum class JobError { None, Cancelled, Unavailable, Internal };

struct JobEvent {
  enum Kind { Chunk, Finish, Failed } kind = Chunk;
  // Chunk
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<sampling::Logprobs> logprobs;  // one per token when the request asked for them
  // Finish
  FinishReason reason = FinishReason::Eog;
  std::string stop_string;
  int32_t end_token = -1;  // the end-of-generation token that stopped it, else -1
  int64_t prompt_tokens = 0, completion_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, taken from the prompt cache, not evaluated
  uint32_t seed = 0;
  JobTimings timings;
  // Failed
  JobError error = JobError::None;
  std::string message;
};

class Job {
 public:
  explicit Job(JobRequest req) : request_(std::move(req)), accepted_(Clock::now()) {}

  const JobRequest& request() const { return request_; }
  Clock::time_point accepted() const { return accepted_; }

  // RPC side: stop the job at the next token boundary (or drop it from the queue).
  void cancel() { cancelled_.store(true, std::memory_order_relaxed); }
  bool cancelled() const { return cancelled_.load(std::memory_order_relaxed); }

  // Scheduler side. Events after the end event are ignored.
  void push(JobEvent ev) {
    {
      std::lock_guard lock(mu_);
      if (ended_) return;
      ended_ = ev.kind != JobEvent::Chunk;
      events_.push_back(std::move(ev));
    }
    cv_.notify_all();
  }

  // RPC side: the next event, or nothing when `timeout` passed first (so the caller can poll its
  // stream for cancellation).
  std::optional<JobEvent> wait_event(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
    JobEvent ev = std::move(events_.front());
    events_.pop_front();
    return ev;
  }

  bool ended() const {
    std::lock_guard lock(mu_);
    return ended_;
  }

 private:
  JobRequest request_;
  Clock::time_point accepted_;
  std::atomic<bool> cancelled_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<JobEvent> events_;
  bool ended_ = false;
};

}  // namespace moe::engine
