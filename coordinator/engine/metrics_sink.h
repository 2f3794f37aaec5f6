// What the engine reports as it works, for whoever exports metrics (the HTTP server's /metrics).
// Called on the scheduler thread; implementations must be cheap and thread-safe.
#pragma once

#include <cstdint>

namespace moe::engine {

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Accepted until the first generated token, in seconds.
  virtual void first_token(double seconds) = 0;
  // Between two consecutive generated tokens of one job.
  virtual void token_gap(double seconds) = 0;
  // A job ended: finished (ok), cancelled, or failed; with the prompt tokens it evaluated, those
  // it took from the prompt cache instead, and the tokens it generated before it ended (a
  // cancelled stream's included).
  enum class Outcome { Ok, Cancelled, Failed };
  virtual void job_end(Outcome outcome, int64_t prompt_tokens, int64_t cached_tokens,
                       int64_t generated_tokens) = 0;
};

}  // namespace moe::engine
