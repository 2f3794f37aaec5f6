// The coordinator's generation engine: a bounded FIFO of jobs and one scheduler thread that runs
// up to -np of them at once, one per SequenceSlot, with continuous batching: every step is one
// forward over all busy slots' new tokens (each decoding slot's sampled token, then prompt chunks
// of the others up to n_batch), so a routed expert is read once for every token that needs it,
// and a new job starts at the next step, not when the others end. Cancellation is checked between
// steps; each job streams its events back into its Job. A slot's KV cache outlives its job (the
// prompt cache, llama-server's cache_prompt): a job goes to the free slot whose tokens share the
// longest prefix with its prompt and evaluates only the rest.
//
// Health probes (grpc.health.v1 Check) run a real one-token forward on the scheduler thread,
// between the steps of whatever is running, so a long generation does not make the server look
// dead. Slot actions (save, restore, erase: slot_file.h) reach the slots the same way.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
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
#include "coordinator/engine/sequence_slot.h"
#include "coordinator/engine/slot_file.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/model/model_arch.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace moe::engine {

struct EngineOptions {
  int64_t n_ctx = 4096;        // per sequence (slot)
  int n_parallel = 1;          // -np: slots, sequences decoded together
  model::KvConfig kv;          // -ctk/-ctv, per-layer overrides, rotation
  size_t queue_capacity = 16;  // waiting jobs, not counting the running one
  int64_t n_batch = 512;       // tokens per forward, all slots together (>= n_parallel)
  // --context-shift: a full context drops the older half of a sequence's tokens after the
  // request's n_keep and generation goes on (not for a model with recurrent layers); off: the
  // generation ends (finish reason context).
  bool context_shift = false;
  // Called on the scheduler thread before each job and probe: restart dead workers. It throws
  // WorkerUnavailable when they cannot be; empty: nothing to prepare.
  std::function<void()> prepare;
  MetricsSink* metrics = nullptr;  // optional; must outlive the engine
  // Slot files: weights_hash() of the model file, so a file of other weights is refused (0: not
  // known; files saved then restore only into such an engine).
  uint64_t weights = 0;
};

// llama-server's POST /slots/{id}?action=save|restore|erase (slot_file.h has the format).
struct SlotAction {
  enum Kind { Save, Restore, Erase } kind = Save;
  int slot = 0;
  std::filesystem::path path;  // Save, Restore
};

struct SlotActionResult {
  // BadRequest: no such slot or an unusable file; NotFound: no such file; Busy: the slot runs a
  // request; Unavailable: the engine is stopping; Failed: the disk or the model failed.
  enum Status { Ok, BadRequest, NotFound, Busy, Unavailable, Failed } status = Ok;
  std::string message;   // why, when not Ok
  int64_t n_tokens = 0;  // saved, restored or erased
  uint64_t n_bytes = 0;  // written or read
  double ms = 0;
};

// What a slot holds, for llama-server's /slots.
struct SlotStats {
  int id = 0;
  int64_t n_ctx = 0;
  bool processing = false;
  int64_t n_cached = 0;  // tokens in its cache (the prompt cache between requests)
};

// The routed experts' live policy, read or changed (Engine::expert_policy).
struct PolicyResult {
  // Invalid: a value out of range (nothing changed); Unsupported, NoRoom, Failed: as
  // model::PolicyOutcome; Unavailable: the engine is stopping.
  enum Status { Ok, Invalid, Unsupported, NoRoom, Failed, Unavailable } status = Ok;
  std::string message;                        // why, when not Ok
  std::optional<model::ExpertPolicy> policy;  // as it is now (none without a GPU forward)
  std::vector<model::LayerSplit> layers;      // each MoE layer's split now
  double ms = 0;                              // waiting for the step in flight, and applying
};

struct EngineStats {
  uint64_t accepted = 0, completed = 0, failed = 0, cancelled = 0, rejected = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;
  double prompt_ms = 0, generation_ms = 0, last_tokens_per_second = 0;
  size_t queue_depth = 0, queue_capacity = 0;
  unsigned running = 0;  // busy slots
  std::vector<SlotStats> slots;
  bool draining = false;
  // The routed experts' runtime figures after the last finished job (GPU forwards only).
  std::optional<model::ExpertRuntimeStats> experts;
  // The experts' live policy after the last finished job or policy change (GPU forwards only).
  std::optional<model::ExpertPolicy> policy;
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

  // Saves, restores or erases a slot's cache (the prompt cache: a later request sharing the
  // restored tokens reuses them). The state is copied out or in on the scheduler thread between
  // steps, and only while the slot is free (Busy otherwise); the file is written or read on the
  // calling thread, so other slots keep decoding meanwhile. A restore checks the whole file first:
  // a bad one leaves the slot as it was (a failure while copying in, a GPU's, leaves it empty).
  SlotActionResult slot_action(const SlotAction& action);
  int64_t n_ctx() const { return opt_.n_ctx; }

  // Reads the routed experts' policy and split (an empty change) or changes it (a recalibration
  // first, when asked). The change is checked here, then applied on the scheduler thread between
  // steps, so no forward sees half of it.
  PolicyResult expert_policy(const model::ExpertPolicyChange& change);

 private:
  struct Probe {
    std::promise<std::string> result;
  };
  struct PolicyTask {
    model::ExpertPolicyChange change;
    std::promise<PolicyResult> result;
  };
  // A slot action's part on the scheduler thread.
  struct SlotTask {
    SlotAction::Kind kind = SlotAction::Save;
    int slot = 0;
    std::vector<int32_t> tokens;  // Save: out; Restore: in
    model::SequenceImage image;
    std::promise<SlotActionResult> result;
  };

  void scheduler_loop();
  void run_probes();
  void run_slot_tasks();
  void run_policy_tasks();
  // Gives queued jobs to free slots (a job that cannot start ends at once).
  void admit();
  // One forward over every busy slot's next tokens, then each slot samples from its row.
  void step();
  // A job ended (in a slot, or before it got one): metrics, counters and its end event.
  void end_job(const SequenceSlot::Progress& progress, Job& job, JobEvent end);
  // The job that ran in `slot` ended with `end`: end_job, and the slot counts as free.
  void slot_ended(SequenceSlot& slot, const std::shared_ptr<Job>& job, JobEvent end);
  void update_slot_stats();

  model::ModelArch& model_;
  const tokenizer::Tokenizer& tok_;
  EngineOptions opt_;
  SlotFingerprint fingerprint_;  // what this engine's slot files must match

  mutable std::mutex mu_;
  std::condition_variable cv_;       // scheduler: work arrived or stop
  std::condition_variable idle_cv_;  // drain: queue empty and nothing running
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Probe>> probes_;
  std::vector<std::shared_ptr<SlotTask>> slot_tasks_;
  std::vector<std::shared_ptr<PolicyTask>> policy_tasks_;
  bool stop_ = false;
  bool draining_ = false;
  unsigned busy_ = 0;  // busy slots
  EngineStats stats_;
  std::atomic<bool> stopping_{false};  // read between steps without the lock

  // Scheduler thread only.
  std::vector<std::unique_ptr<SequenceSlot>> slots_;
  uint64_t clock_ = 0;  // orders the slots' use (least recently used first)
  size_t rotate_ = 0;   // which slot's prompt is served first when the batch is full
  // The probes' own sequence, at a fixed address: a GPU forward keeps per-cache state and must
  // not hand a slot's to a probe.
  std::optional<model::KvCache> probe_cache_;

  std::vector<float> logits_;  // [n_parallel, n_vocab]
  // The vocabulary as grammars see it: built at the first constrained job (its prefix tree takes a
  // moment for 150k tokens), then shared by every matcher.
  std::shared_ptr<const grammar::TokenBytes> token_bytes_;
  const std::shared_ptr<const grammar::TokenBytes>& token_bytes();
  std::thread scheduler_;  // last: started once everything above exists
};

}  // namespace moe::engine
