#include "coordinator/model/mtp_draft.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/model/generation.h"

namespace moe::model {
namespace {

struct MtpState {
  MtpState(ModelArch& m, int64_t n_ctx, int draft_max)
      : model(m), cache(m.make_mtp_cache(n_ctx)), draft_max(draft_max) {
    const auto E = static_cast<size_t>(m.config().n_embd);
    pending.assign(E, 0.0f);
    before_last.assign(E, 0.0f);
    logits.resize(static_cast<size_t>(m.config().n_vocab));
  }

  // After a target forward of `tokens` from pos0 with its hidden rows.
  void observe(std::span<const int32_t> tokens, int64_t pos0, const float* hidden) {
    const auto n = static_cast<int64_t>(tokens.size());
    const int64_t E = model.config().n_embd;
    if (cache.n_past() > pos0) cache.truncate(pos0);
    if (pos0 == 0) std::fill(pending.begin(), pending.end(), 0.0f);  // a new sequence
    before_last = pending;
    last.assign(hidden, hidden + n * E);
    last_pos0 = pos0;
    target_past = pos0 + n;
    if (cache.n_past() == pos0 && pos0 + n <= cache.n_ctx()) {
      // Row i pairs token pos0 + i with the target's state at pos0 + i - 1.
      h_in.resize(static_cast<size_t>(n * E));
      std::copy(pending.begin(), pending.end(), h_in.begin());
      std::copy(last.begin(), last.end() - E, h_in.begin() + E);
      h_out.resize(h_in.size());
      model.mtp_forward(tokens, h_in.data(), cache, h_out.data(), nullptr);
    }
    // Else the block missed earlier positions (a context shift, say): it drafts nothing until
    // the sequence starts again. (`hidden` may be the target's scratch, which the block's
    // forward reuses: the copy in `last` is what is read from here on.)
    pending.assign(last.end() - E, last.end());
  }

  // The target went back to n_past positions (a verification kept only some of its rows).
  void rewind(int64_t n_past) {
    const int64_t E = model.config().n_embd;
    if (cache.n_past() > n_past) cache.truncate(n_past);
    if (n_past == last_pos0) {
      pending = before_last;
    } else if (n_past > last_pos0 && n_past - last_pos0 <= static_cast<int64_t>(last.size()) / E) {
      const auto* row = last.data() + (n_past - 1 - last_pos0) * E;
      pending.assign(row, row + E);
    }
    target_past = n_past;
  }

  std::vector<int32_t> draft(std::span<const int32_t> history, int n) {
    std::vector<int32_t> out;
    if (history.empty()) return out;
    if (cache.n_past() > target_past) cache.truncate(target_past);
    if (cache.n_past() != target_past) return out;
    const int64_t E = model.config().n_embd;
    int32_t tok = history.back();
    h_in = pending;
    h_out.resize(static_cast<size_t>(E));
    while (static_cast<int>(out.size()) < std::min(n, draft_max) &&
           cache.n_past() < cache.n_ctx()) {
      model.mtp_forward({&tok, 1}, h_in.data(), cache, h_out.data(), logits.data());
      if (logits_out) *logits_out = logits;
      tok = argmax(logits);
      out.push_back(tok);
      h_in.swap(h_out);
    }
    return out;
  }

  ModelArch& model;
  KvCache cache;
  int draft_max;
  std::vector<float> pending;      // the target's state at the position before its next token
  std::vector<float> before_last;  // `pending` before the last observed forward
  std::vector<float> last;         // that forward's hidden rows
  int64_t last_pos0 = 0, target_past = 0;
  std::vector<float> h_in, h_out, logits;
  std::vector<float>* logits_out = nullptr;
};

}  // namespace

Drafter mtp_drafter(ModelArch& model, int64_t n_ctx, int draft_max,
                    std::vector<float>* last_logits) {
  if (!model.has_mtp()) {
    throw Error(std::string(model.name()) + ": the model file has no multi-token-prediction block");
  }
  if (draft_max < 1) throw Error("mtp drafts: --draft-max must be at least 1");
  auto st = std::make_shared<MtpState>(model, n_ctx, draft_max);
  st->logits_out = last_logits;
  Drafter d;
  d.draft = [st](std::span<const int32_t> history) { return st->draft(history, st->draft_max); };
  d.draft_n = [st](std::span<const int32_t> history, int n) { return st->draft(history, n); };
  d.max_len = draft_max;
  d.observe = [st](std::span<const int32_t> t, int64_t p, const float* h) { st->observe(t, p, h); };
  d.rewind = [st](int64_t n) { st->rewind(n); };
  return d;
}

}  // namespace moe::model
