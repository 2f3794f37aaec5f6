// Decoding with drafts verified in one batch (speculative decoding, issue 33): the chosen tokens
// are those of generate() without drafts, greedy or sampled (the choice is made once per token,
// from the same row, in the same order); the drafts only let several of them come from one
// forward. After a verification the sequence state goes back to
// the last accepted token: attention rows by truncation, a recurrent state (qwen35moe) by
// restoring the checkpoint taken before the batch and evaluating the accepted tokens again.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "coordinator/model/draft_policy.h"
#include "coordinator/model/generation.h"
#include "coordinator/model/ngram_draft.h"

namespace moe::model {

struct SpeculativeStats {
  int64_t verifications = 0;  // batches with at least one drafted token
  int64_t drafted = 0;        // drafted tokens verified
  int64_t accepted = 0;       // of them, equal to the choice from their row
  int64_t replays = 0;        // recurrent states restored and evaluated again
};

// "V verifications, D drafted, A accepted (P%), R replays": the tools' and tests' line.
std::string describe(const SpeculativeStats& st);

// Proposes the tokens that may follow `history` (the prompt and every token chosen so far);
// an empty draft means one token is decoded alone.
using DraftFn = std::function<std::vector<int32_t>(std::span<const int32_t> history)>;

// A source of drafts. One that follows the target's state (the MTP block) also sees the target's
// hidden rows after every forward (`observe`, ForwardHooks::observe_hidden) and hears when the
// sequence went back to n positions after a verification (`rewind`).
struct Drafter {
  DraftFn draft;
  std::function<void(std::span<const int32_t> tokens, int64_t pos0, const float* hidden)> observe;
  std::function<void(int64_t n_past)> rewind;
  // A drafter whose every token costs a forward of its own (the MTP block): draft_n proposes at
  // most n, and the cost model is asked before drafting how many of max_len it would verify (one
  // is still drafted when none would be, to keep measuring the acceptance).
  std::function<std::vector<int32_t>(std::span<const int32_t> history, int n)> draft_n;
  int max_len = 0;
  Drafter() = default;
  // A plain function drafts from the text alone.
  template <typename F>
  requires std::is_invocable_r_v<std::vector<int32_t>, F, std::span<const int32_t>> Drafter(F f)
      : draft(std::move(f)) {}  // NOLINT(google-explicit-constructor)
};

// The n-gram lookup as a Drafter.
Drafter ngram_drafter(const NgramDraftOptions& opt);

// As generate(), opt.pick included: a drafted token stands when the choice from its row equals
// it, which for a sampler is the speculative-sampling acceptance rule for a drafter proposing one
// token with certainty (accept with probability p(draft), else draw from the rest), so the
// distribution is unchanged, and with the same sampler state the very same tokens come out. The
// cache ends as generate() leaves it. Uses the cache's checkpoint when the model has recurrent
// layers (it replaces any checkpoint the caller kept). `stats`, when given, counts the drafts.
// `policy`, when given, decides how many of each draft to verify and learns from every step's
// time and every draft's outcome (it may be kept across calls); without it every draft is
// verified whole.
GenerateResult generate_speculative(ModelArch& model, KvCache& cache,
                                    std::span<const int32_t> prompt, const GenerateOptions& opt,
                                    const Drafter& drafter, SpeculativeStats* stats = nullptr,
                                    DraftPolicy* policy = nullptr);

}  // namespace moe::model
