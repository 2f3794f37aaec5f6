// The per-architecture seam (DESIGN.md §6): hyperparameters, tensor table and forward. A new
// architecture is a new ModelArch implementation plus one line in create_model_arch().
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "common/gguf.h"
#include "coordinator/model/kv_cache.h"
#include "coordinator/model/sequence_image.h"
#include "coordinator/residency/expert_policy.h"
#include "coordinator/residency/expert_runtime_stats.h"
#include "experts/expert_executor.h"
#include "experts/model_config.h"
#include "kernels/cpu/thread_pool.h"

namespace moe::model {

class OpProfile;

// What one MoE layer did for a batch, handed to ForwardHooks::observe_layer. Pointers are valid
// only during the callback. Row t is the token at position pos0 + t.
struct LayerTrace {
  int64_t layer = 0;
  int64_t pos0 = 0;
  int64_t n_tokens = 0;
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_embd = 0;
  const float* router_logits = nullptr;  // [n_tokens, n_expert]
  const float* router_probs = nullptr;   // [n_tokens, n_expert] softmax of the logits
  const int32_t* experts = nullptr;      // [n_tokens, n_expert_used], descending probability
  const float* weights = nullptr;        // [n_tokens, n_expert_used], renormalized
  const float* l_out = nullptr;          // [n_tokens, n_embd] residual stream after the layer
  // [n_tokens, n_embd] residual stream after the mixer (attention / DeltaNet), before the FFN;
  // null where the architecture does not keep it (qwen3moe).
  const float* attn_residual = nullptr;
};

// Optional test and tooling hooks; empty functions cost nothing.
struct ForwardHooks {
  // Return true and write n_expert_used ids to override the router's choice for the token at
  // `pos` in `layer`; the weights are then the router's probabilities of those experts,
  // renormalized.
  std::function<bool(int64_t layer, int64_t pos, int32_t* experts)> force_experts;
  std::function<void(const LayerTrace&)> observe_layer;
  // The output-normed hidden state of every row of a forward (n rows of n_embd, tokens at pos0
  // onwards), after the logits: what the multi-token-prediction block drafts from (CPU
  // forwards). The rows are the forward's scratch: valid until the next forward of the model.
  std::function<void(std::span<const int32_t> tokens, int64_t pos0, const float* hidden)>
      observe_hidden;
};

enum class LogitsMode { All, Last };

// One sequence's new tokens in a batch of several sequences (ModelArch::forward_batch).
struct SequenceChunk {
  std::span<const int32_t> tokens;  // at positions cache->n_past() onwards; at least one
  KvCache* cache = nullptr;         // a different cache for every chunk of a batch
};

class ModelArch {
 public:
  virtual ~ModelArch() = default;
  virtual std::string_view name() const = 0;
  virtual const ModelConfig& config() const = 0;

  // Evaluates `tokens` as one batch at positions cache.n_past() onwards, appending their K/V (and
  // advancing the recurrent state) in `cache`. One call at a time per ModelArch (it owns the
  // scratch buffers and the thread pool). Writes logits [n_tokens, n_vocab] (All) or [1, n_vocab]
  // of the last token (Last). Throws moe::Error (cache unchanged) on a bad token id or when the
  // context would overflow; a cache is left as it was by any forward that throws.
  virtual void forward(std::span<const int32_t> tokens, KvCache& cache, LogitsMode mode,
                       float* logits, const ForwardHooks* hooks = nullptr) = 0;

  // Evaluates several sequences' new tokens as one forward (continuous batching: prefill chunks
  // of some sequences beside decode tokens of others), so that a weight, and a routed expert,
  // is read once for every token of the batch that needs it. Writes the logits of each chunk's
  // last token, row i for chunk i ([chunks.size(), n_vocab]). Checks every chunk first (token
  // ids, room in its cache, distinct caches) and throws moe::Error before anything runs; a
  // forward that throws later leaves every cache as it was. The default runs one forward per
  // chunk (not batched, and a failure midway leaves the earlier chunks evaluated).
  virtual void forward_batch(std::span<const SequenceChunk> chunks, float* logits);

  // The sequence state (KV cache, and recurrent state for hybrid models) of one sequence.
  KvCache make_cache(int64_t n_ctx, const KvConfig& kv) const {
    return KvCache(config(), n_ctx, kv, cache_storage());
  }
  KvCache make_cache(int64_t n_ctx, KvType k_type, KvType v_type) const {
    return make_cache(n_ctx, KvConfig::uniform(k_type, v_type));
  }
  // The prompt cache's checkpoints of a hybrid model's sequence (KvCache::save_checkpoint): a GPU
  // forward copies its VRAM state too. restore_checkpoint returns false when the state is gone
  // (a GPU forward's slot went to another sequence); the cache is then unchanged.
  virtual void save_checkpoint(KvCache& cache) { cache.save_checkpoint(); }
  virtual bool restore_checkpoint(KvCache& cache) {
    cache.restore_checkpoint();
    return true;
  }
  // A sequence's state as host bytes and back (slot files, coordinator/engine/slot_file.h): the
  // default reads and writes the host KvCache; a GPU forward copies its VRAM state. Import throws
  // moe::Error with the cache unchanged when the image does not fit it (KvCache::check_image); a
  // failure while copying in (VRAM) leaves the cache empty. The imported cache has no checkpoint.
  virtual void export_sequence(const KvCache& cache, SequenceImage& image) {
    cache.export_image(image);
  }
  virtual void import_sequence(KvCache& cache, const SequenceImage& image) {
    cache.import_image(image);
  }
  // Context shift (--context-shift, kv_shift.h): drops positions [n_keep, n_keep + n_discard) of
  // the sequence and moves the later ones down, their K re-roped. moe::Error with nothing changed
  // on bad arguments, and always for a model with recurrent layers. The default shifts the host
  // cache; a GPU forward shifts its VRAM state.
  virtual void shift_context(KvCache& cache, int64_t n_keep, int64_t n_discard);
  // Where this forward keeps sequence state: GPU forwards keep it in VRAM (KvStorage::None).
  virtual KvStorage cache_storage() const { return KvStorage::Host; }
  // One line on where the work ran since start (GPU forwards: expert items on VRAM copies, over
  // PCIe and on the CPU); empty when there is nothing to say.
  virtual std::string runtime_stats() const { return {}; }
  // The same as numbers (GetStats); nullopt for forwards without a GPU.
  virtual std::optional<ExpertRuntimeStats> expert_runtime() const { return std::nullopt; }
  // The live policy of the routed experts (expert_policy.h): nullopt where there is none (the
  // CPU-only forward).
  virtual std::optional<ExpertPolicy> expert_policy() const { return std::nullopt; }
  // Applies a change that validate() accepted, between forwards. The default refuses
  // (Unsupported): every routed expert runs on the CPU.
  virtual PolicyOutcome set_expert_policy(const ExpertPolicyChange& change);
  // Where each MoE layer's routed experts are now; the default: all on the CPU.
  virtual std::vector<LayerSplit> layer_split() const {
    return all_on_cpu(config().n_layer, config().n_expert);
  }
  // CPU forwards time their ops into `profile` while it is active (null: none); false where the
  // forward has no per-op profile (the GPU forwards).
  virtual bool set_op_profile(OpProfile* /*profile*/) { return false; }

  // Multi-token prediction (Qwen3.5/3.6's MTP block, llama.cpp's draft-mtp): whether this
  // forward has it, and the cache of its own attention layer (one per sequence).
  virtual bool has_mtp() const { return false; }
  virtual KvCache make_mtp_cache(int64_t n_ctx) const;
  // The block over n rows: tokens[i] at position cache.n_past() + i with h[i], the target's
  // output-normed hidden state at the position before (observe_hidden's rows, shifted by one);
  // stores its K/V in `cache` and advances it, writes its own hidden state (the next draft's h)
  // into h_out and, unless null, the last row's logits. moe::Error without an MTP block.
  virtual void mtp_forward(std::span<const int32_t> tokens, const float* h, KvCache& cache,
                           float* h_out, float* logits);
};

// The implementation for the file's general.architecture; throws moe::Error for unknown
// architectures or bad tensors. `file` and `pool` must outlive the result. `experts` replaces the
// in-process CPU expert executor (e.g. a RemoteExpertExecutor created before anything heavy); it
// must compute the experts of this same file. Null: the in-process default.
std::unique_ptr<ModelArch> create_model_arch(const gguf::GgufFile& file, cpu::ThreadPool& pool,
                                             std::unique_ptr<ExpertExecutor> experts = nullptr);

}  // namespace moe::model
