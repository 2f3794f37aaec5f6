#include "coordinator/model/model_arch.h"

#include <string>
#include <utility>

#include "common/error.h"
#include "coordinator/model/batch_routing.h"
#include "coordinator/model/gpt_oss.h"
#include "coordinator/model/kv_shift.h"
#include "coordinator/model/qwen35moe.h"
#include "coordinator/model/qwen3moe.h"

namespace moe::model {

void ModelArch::forward_batch(std::span<const SequenceChunk> chunks, float* logits) {
  check_chunks(chunks, config().n_vocab);
  const auto n_vocab = static_cast<size_t>(config().n_vocab);
  for (size_t i = 0; i < chunks.size(); ++i) {
    forward(chunks[i].tokens, *chunks[i].cache, LogitsMode::Last, logits + i * n_vocab);
  }
}

void ModelArch::shift_context(KvCache& cache, int64_t n_keep, int64_t n_discard) {
  shift_kv(cache, config(), n_keep, n_discard);
}

PolicyOutcome ModelArch::set_expert_policy(const ExpertPolicyChange& /*change*/) {
  return {PolicyOutcome::Unsupported, kNoExpertPolicy};
}

KvCache ModelArch::make_mtp_cache(int64_t /*n_ctx*/) const {
  throw Error(std::string(name()) + " has no multi-token-prediction block");
}

void ModelArch::mtp_forward(std::span<const int32_t> /*tokens*/, const float* /*h*/,
                            KvCache& /*cache*/, float* /*h_out*/, float* /*logits*/) {
  throw Error(std::string(name()) + " has no multi-token-prediction block");
}

std::unique_ptr<ModelArch> create_model_arch(const gguf::GgufFile& file, cpu::ThreadPool& pool,
                                             std::unique_ptr<ExpertExecutor> experts) {
  const std::string_view arch = file.require_string("general.architecture");
  if (arch == "qwen3moe") return std::make_unique<Qwen3Moe>(file, pool, std::move(experts));
  if (arch == "qwen35moe") return std::make_unique<Qwen35Moe>(file, pool, std::move(experts));
  if (arch == "gpt-oss") return std::make_unique<GptOss>(file, pool, std::move(experts));
  throw Error("unsupported model architecture '" + std::string(arch) +
              "' (supported: qwen3moe, qwen35moe, gpt-oss)");
}

}  // namespace moe::model
