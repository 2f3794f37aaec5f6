#include "coordinator/model/speculative.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"

namespace moe::model {

Drafter ngram_drafter(const NgramDraftOptions& opt) {
  return [opt](std::span<const int32_t> history) { return ngram_draft(history, opt); };
}

GenerateResult generate_speculative(ModelArch& model, KvCache& cache,
                                    std::span<const int32_t> prompt, const GenerateOptions& opt,
                                    const Drafter& drafter, SpeculativeStats* stats,
                                    DraftPolicy* policy) {
  if (prompt.empty()) throw Error("generate: empty prompt");
  const auto n_vocab = static_cast<size_t>(model.config().n_vocab);
  cache.check_room(static_cast<int64_t>(prompt.size()) + std::max<int64_t>(opt.n_steps - 1, 0));
  // Called once per emitted token, on the row generate() would choose it from, in the same order:
  // a sampler then draws exactly as without drafts.
  const auto choose = [&](std::span<const float> r) { return opt.pick ? opt.pick(r) : argmax(r); };
  SpeculativeStats st;
  GenerateResult res;
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits(n_vocab);
  // A drafter that follows the target sees the hidden rows of every forward.
  ForwardHooks with_observer = opt.hooks ? *opt.hooks : ForwardHooks{};
  if (drafter.observe) {
    with_observer.observe_hidden = [&, user = with_observer.observe_hidden](
                                       std::span<const int32_t> t, int64_t p, const float* h) {
      if (user) user(t, p, h);
      drafter.observe(t, p, h);
    };
  }
  const ForwardHooks* hooks = drafter.observe ? &with_observer : opt.hooks;
  const auto rewound = [&] {
    if (drafter.rewind) drafter.rewind(cache.n_past());
  };
  model.forward(prompt, cache, LogitsMode::Last, logits.data(), hooks);
  if (opt.n_steps <= 0) {
    if (stats) *stats = st;
    return res;
  }
  // `row` holds the logits `cur` was chosen from.
  std::vector<float> row = logits;
  int32_t cur = choose(row);
  // Records a chosen token; false when the caller stops after it.
  const auto emit = [&](int32_t tok, std::span<const float> from) {
    res.tokens.push_back(tok);
    history.push_back(tok);
    if (opt.keep_logits) res.logits.insert(res.logits.end(), from.begin(), from.end());
    return !opt.on_token || opt.on_token(tok);
  };
  while (true) {
    if (!emit(cur, row)) break;
    const auto left = opt.n_steps - static_cast<int64_t>(res.tokens.size());
    if (left == 0) break;
    // Draft no further than the tokens still to choose: the last one needs no evaluation. A
    // drafter that pays per token asks the policy first and drafts only what it would verify.
    std::vector<int32_t> d;
    if (policy && drafter.draft_n && drafter.max_len > 0) {
      const int want = std::min<int64_t>(drafter.max_len, left - 1);
      d = want > 0 ? drafter.draft_n(history, std::max(policy->length(want), 1))
                   : std::vector<int32_t>{};
    } else {
      d = drafter.draft(history);
    }
    d.resize(std::min<size_t>(d.size(), static_cast<size_t>(left - 1)));
    // The policy may verify fewer, or none: then the first draft is only compared with the
    // token chosen next (its acceptance, measured for free).
    int32_t shadow = -1;
    if (policy) {
      const auto k = static_cast<size_t>(policy->length(static_cast<int>(d.size())));
      if (k == 0 && !d.empty()) shadow = d[0];
      d.resize(std::min(d.size(), k));
    }
    const auto t0 = std::chrono::steady_clock::now();
    const auto step_done = [&](size_t n) {
      if (policy) {
        policy->observe_step(
            static_cast<int>(n),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    };
    std::vector<int32_t> batch{cur};
    batch.insert(batch.end(), d.begin(), d.end());
    const int64_t n_before = cache.n_past();
    const bool rewind_by_checkpoint = !d.empty() && cache.has_recurrent_state();
    if (rewind_by_checkpoint) model.save_checkpoint(cache);
    logits.resize(batch.size() * n_vocab);
    model.forward(batch, cache, d.empty() ? LogitsMode::Last : LogitsMode::All, logits.data(),
                  hooks);
    if (d.empty()) {
      step_done(1);
      std::copy_n(logits.begin(), n_vocab, row.begin());
      cur = choose(row);
      if (policy && shadow >= 0) policy->observe_drafts(1, cur == shadow ? 1 : 0);
      continue;
    }
    ++st.verifications;
    st.drafted += static_cast<int64_t>(d.size());
    // Row i holds the distribution after batch[i]: the token chosen from it stands in for draft i
    // when they agree (for a sampled choice this is the speculative-sampling rule for a drafter
    // that proposes one token with certainty: accept with probability p(draft), else draw from
    // the rest, i.e. draw from p), and is the next token when they do not.
    size_t a = 0;
    bool stop = false;
    int32_t next = -1;
    while (true) {
      const std::span<const float> ri(logits.data() + a * n_vocab, n_vocab);
      const int32_t t = choose(ri);
      if (a == d.size() || t != d[a]) {
        next = t;
        std::copy(ri.begin(), ri.end(), row.begin());
        break;
      }
      ++a;
      if (!emit(t, ri)) {
        stop = true;
        break;
      }
    }
    st.accepted += static_cast<int64_t>(a);
    if (policy) policy->observe_drafts(static_cast<int>(d.size()), static_cast<int>(a));
    // Keep the batch's first token and the accepted drafts, the rows after them having been
    // computed for rejected ones; not a token the caller stopped at, which generate() does not
    // evaluate either.
    const size_t keep_n = 1 + a - (stop ? 1 : 0);
    if (keep_n < batch.size()) {
      if (!rewind_by_checkpoint) {
        cache.truncate(n_before + static_cast<int64_t>(keep_n));
        rewound();
      } else {
        if (!model.restore_checkpoint(cache)) {
          throw Error("speculative decoding: the sequence's checkpoint is gone");
        }
        rewound();
        ++st.replays;
        // The replay's logits are those of a row already chosen from: written and dropped.
        model.forward(std::span<const int32_t>(batch.data(), keep_n), cache, LogitsMode::Last,
                      logits.data(), hooks);
      }
    }
    step_done(batch.size());
    if (stop) break;
    cur = next;
  }
  if (stats) *stats = st;
  return res;
}

std::string describe(const SpeculativeStats& st) {
  const double pct =
      st.drafted > 0 ? 100.0 * static_cast<double>(st.accepted) / static_cast<double>(st.drafted)
                     : 0.0;
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "%lld verifications, %lld drafted, %lld accepted (%.1f%%), %lld replays",
                static_cast<long long>(st.verifications), static_cast<long long>(st.drafted),
                static_cast<long long>(st.accepted), pct, static_cast<long long>(st.replays));
  return buf;
}

}  // namespace moe::model
