#include "coordinator/model/speculative.h"

#include <algorithm>
#include <vector>

#include "common/error.h"

namespace moe::model {

Drafter ngram_drafter(const NgramDraftOptions& opt) {
  return [opt](std::span<const int32_t> history) { return ngram_draft(history, opt); };
}

GenerateResult generate_speculative(ModelArch& model, KvCache& cache,
                                    std::span<const int32_t> prompt, const GenerateOptions& opt,
                                    const Drafter& drafter, SpeculativeStats* stats) {
  if (opt.pick) throw Error("speculative decoding: only greedy choice is supported");
  if (prompt.empty()) throw Error("generate: empty prompt");
  const auto n_vocab = static_cast<size_t>(model.config().n_vocab);
  cache.check_room(static_cast<int64_t>(prompt.size()) + std::max<int64_t>(opt.n_steps - 1, 0));
  SpeculativeStats st;
  GenerateResult res;
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits(n_vocab);
  model.forward(prompt, cache, LogitsMode::Last, logits.data(), opt.hooks);
  // `row` holds the logits the next token is chosen from.
  std::vector<float> row = logits;
  bool stop = false;
  while (!stop && static_cast<int64_t>(res.tokens.size()) < opt.n_steps) {
    const int32_t cur = argmax(row);
    res.tokens.push_back(cur);
    history.push_back(cur);
    if (opt.keep_logits) res.logits.insert(res.logits.end(), row.begin(), row.end());
    if (opt.on_token && !opt.on_token(cur)) break;
    const auto left = opt.n_steps - static_cast<int64_t>(res.tokens.size());
    if (left == 0) break;
    // Draft no further than the tokens still to choose: the last one needs no evaluation.
    std::vector<int32_t> d = drafter(history);
    d.resize(std::min<size_t>(d.size(), static_cast<size_t>(left - 1)));
    std::vector<int32_t> batch{cur};
    batch.insert(batch.end(), d.begin(), d.end());
    const int64_t n_before = cache.n_past();
    const bool rewind_by_checkpoint = !d.empty() && cache.has_recurrent_state();
    if (rewind_by_checkpoint) model.save_checkpoint(cache);
    logits.resize(batch.size() * n_vocab);
    model.forward(batch, cache, d.empty() ? LogitsMode::Last : LogitsMode::All, logits.data(),
                  opt.hooks);
    if (d.empty()) {
      std::copy_n(logits.begin(), n_vocab, row.begin());
      continue;
    }
    ++st.verifications;
    st.drafted += static_cast<int64_t>(d.size());
    // Row i holds the choice after batch[i]; draft i stands while it equals that choice.
    size_t a = 0;
    while (a < d.size() && !stop) {
      const std::span<const float> ri(logits.data() + a * n_vocab, n_vocab);
      if (argmax(ri) != d[a]) break;
      res.tokens.push_back(d[a]);
      history.push_back(d[a]);
      if (opt.keep_logits) res.logits.insert(res.logits.end(), ri.begin(), ri.end());
      ++a;
      if (opt.on_token && !opt.on_token(d[a - 1])) stop = true;
    }
    st.accepted += static_cast<int64_t>(a);
    std::copy_n(logits.begin() + static_cast<std::ptrdiff_t>(a * n_vocab), n_vocab, row.begin());
    if (a == d.size()) continue;
    // Back to cur and the accepted drafts: the rows after them were computed for rejected ones.
    const int64_t keep = n_before + 1 + static_cast<int64_t>(a);
    if (!rewind_by_checkpoint) {
      cache.truncate(keep);
      continue;
    }
    if (!model.restore_checkpoint(cache)) {
      throw Error("speculative decoding: the sequence's checkpoint is gone");
    }
    ++st.replays;
    std::vector<float> last(n_vocab);
    model.forward(std::span<const int32_t>(batch.data(), 1 + a), cache, LogitsMode::Last,
                  last.data(), opt.hooks);
  }
  if (stats) *stats = st;
  return res;
}

}  // namespace moe::model
