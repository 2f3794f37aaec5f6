// Drafting by n-gram lookup (speculative decoding without a draft model): the tokens that
// followed the most recent earlier occurrence of the sequence's last n tokens, for n from the
// lookup size down to the minimum match. Code edits, quoting and structured output repeat
// themselves, so these drafts are often right; a wrong one costs only its verification.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace moe::model {

struct NgramDraftOptions {
  int n_max = 3;      // the longest suffix looked up (--spec-ngram-size)
  int n_min = 1;      // the shortest one that still counts as a match (--spec-ngram-min)
  int draft_max = 8;  // tokens drafted at most (--draft-max)
};

// Up to draft_max tokens that followed the latest earlier match of the history's last n tokens,
// the longest n first; empty when nothing matches. Walks at most n_max windows per position of
// the history, so its cost is bounded by the history's length.
std::vector<int32_t> ngram_draft(std::span<const int32_t> history, const NgramDraftOptions& opt);

}  // namespace moe::model
