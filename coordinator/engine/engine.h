// The coordinator's generation engine: a bounded FIFO of jobs and one scheduler thread that runs
// them one sequence at a time over the model (prompt in batches, then one token per step), checks
// cancellation between steps, and streams events back into each Job. The KV cache outlives the
// job (the prompt cache, llama-server's cache_prompt): the next job keeps the longest common
// prefix of its prompt with the tokens the cache holds and evaluates only the rest.
//
// Health probes (grpc.health.v1 Check) run a real one-token forward on the scheduler thread,
// between the steps of whatever is running, so a long generation does not make the server look
// dead.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "coordinator/engine/job.h"
#include "coordinator/engine/metrics_sink.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace moe::engine {

struct EngineOptions {
  int64_t n_ctx = 4096;        // per sequence
  model::KvConfig kv;          // -ctk/-ctv, per-layer overrides, rotation
  size_t queue_capacity = 16;  // waiting jobs, not counting the running one
  int64_t n_batch = 512;       // prompt tokens per forward
  // Called on the scheduler thread before each job and probe: restart dead workers. It throws
  // WorkerUnavailable when they cannot be; empty: nothing to prepare.
  std::function<void()> prepare;
  MetricsSink* metrics = nullptr;  // optional; must outlive the engine
};

struct EngineStats {
  uint64_t accepted = 0, completed = 0, failed = 0, cancelled = 0, rejected = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  double prompt_ms = 0, generation_ms = 0, last_tokens_per_second = 0;
  size_t queue_depth = 0, queue_capacity = 0;
  unsigned running = 0;
  bool draining = false;
  // The routed experts' runtime figures after the last finished job (GPU forwards only).
  std::optional<model::ExpertRuntimeStats> experts;
};

class Engine {
 public:
  // `model` and `tok` must outlive the engine. Starts the scheduler thread.
  Engine(model::ModelArch& model, const tokenizer::Tokenizer& tok, EngineOptions opt);
  // Stops the scheduler (idempotent); queued jobs fail with Unavailable, the running one at its
  // next token. Afterwards submit() answers Draining and probe() fails.
  void stop();
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  enum class Admit { Ok, QueueFull, Draining };
  Admit submit(std::shared_ptr<Job> job);

  // One real forward of one token in a scratch cache: "" when it worked, else why not. Waits up to
  // `timeout` for the scheduler to get to it.
  std::string probe(std::chrono::milliseconds timeout);

  // Stops accepting jobs and waits until none is queued or running; false when `deadline` came
  // first.
  bool drain(Clock::time_point deadline);

  EngineStats stats() const;
  int64_t n_ctx() const { return opt_.n_ctx; }

 private:
  struct Probe {
    std::promise<std::string> result;
  };

  void scheduler_loop();
  void run_job(Job& job);
  void run_probes();
  // Tokens a job got through, kept up to date as it runs so that the work of a job that is
  // cancelled or fails midway is counted too.
  struct Progress {
    int64_t prompt_tokens = 0, cached_tokens = 0, generated_tokens = 0;
  };
  // Generates for `job`; returns the Finish event (Failed events are thrown as exceptions).
  JobEvent generate(Job& job, uint32_t* seed, Progress* progress);

  model::ModelArch& model_;
  const tokenizer::Tokenizer& tok_;
  EngineOptions opt_;

  mutable std::mutex mu_;
  std::condition_variable cv_;       // scheduler: work arrived or stop
  std::condition_variable idle_cv_;  // drain: queue empty and nothing running
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Probe>> probes_;
  bool stop_ = false;
  bool draining_ = false;
  bool busy_ = false;
  EngineStats stats_;
  std::atomic<bool> stopping_{false};  // read between tokens without the lock

  // The prompt cache: the last job's sequence, kept when it ends, and the tokens whose K/V (and
  // recurrent state) it holds, always exactly cache->n_past() of them (a forward that throws
  // leaves the cache as it was). Scheduler thread only.
  struct Slot {
    std::optional<model::KvCache> cache;  // made at the first job, n_ctx positions
    std::vector<int32_t> tokens;
  };
  Slot slot_;
  // The probes' own sequence, at a fixed address: a GPU forward keeps per-cache state and must
  // not hand the slot's to a probe.
  std::optional<model::KvCache> probe_cache_;

  std::vector<float> logits_;
  // The vocabulary as grammars see it: built at the first constrained job (its prefix tree takes a
  // moment for 150k tokens), then shared by every matcher.
  std::shared_ptr<const grammar::TokenBytes> token_bytes_;
  const std::shared_ptr<const grammar::TokenBytes>& token_bytes();
  std::thread scheduler_;  // last: started once everything above exists
};

}  // namespace moe::engine
