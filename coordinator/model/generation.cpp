#include "coordinator/model/generation.h"

#include "common/error.h"

namespace moe::model {

int32_t argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return static_cast<int32_t>(best);
}

std::vector<float> evaluate_batch(ModelArch& model, KvCache& cache, std::span<const int32_t> tokens,
                                  const ForwardHooks* hooks) {
  std::vector<float> logits(tokens.size() * static_cast<size_t>(model.config().n_vocab));
  model.forward(tokens, cache, LogitsMode::All, logits.data(), hooks);
  return logits;
}

GenerateResult generate(ModelArch& model, KvCache& cache, std::span<const int32_t> prompt,
                        const GenerateOptions& opt) {
  if (prompt.empty()) throw Error("generate: empty prompt");
  const auto n_vocab = static_cast<size_t>(model.config().n_vocab);
  // Fail before any work when the prompt and all decode steps cannot fit.
  cache.check_room(static_cast<int64_t>(prompt.size()) + std::max<int64_t>(opt.n_steps - 1, 0));
  GenerateResult res;
  std::vector<float> row(n_vocab);
  model.forward(prompt, cache, LogitsMode::Last, row.data(), opt.hooks);
  for (int64_t s = 0; s < opt.n_steps; ++s) {
    const int32_t tok = opt.pick ? opt.pick(row) : argmax(row);
    res.tokens.push_back(tok);
    if (opt.keep_logits) res.logits.insert(res.logits.end(), row.begin(), row.end());
    if (opt.on_token && !opt.on_token(tok)) break;
    if (s + 1 < opt.n_steps) {
      model.forward(std::span<const int32_t>(&tok, 1), cache, LogitsMode::Last, row.data(),
                    opt.hooks);
    }
  }
  return res;
}

}  // namespace moe::model
