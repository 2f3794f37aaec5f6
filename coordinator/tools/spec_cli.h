// The speculative-decoding flags moe-run and moe-bench share, as llama.cpp spells them:
// --spec-type none|ngram|mtp, --draft-max (--draft), --spec-ngram-size, --spec-ngram-min.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "coordinator/model/model_arch.h"
#include "coordinator/model/mtp_draft.h"
#include "coordinator/model/ngram_draft.h"
#include "coordinator/model/speculative.h"

namespace moe::tools {

struct SpecArgs {
  std::string type = "none";  // none | ngram | mtp
  moe::model::NgramDraftOptions ngram;
};

// `what_for` says which test or mode the drafts serve (in the help).
inline void add_spec_options(CLI::App& app, SpecArgs& a, const std::string& what_for) {
  app.add_option("--spec-type", a.type,
                 what_for +
                     ": none, ngram (draft from earlier text) or mtp (draft with the model's "
                     "multi-token-prediction block, Qwen3.5/3.6), verified in one batch; on the "
                     "CPU the tokens are the same as without")
      ->check(CLI::IsMember({"none", "ngram", "mtp"}));
  app.add_option("--draft-max,--draft", a.ngram.draft_max, "--spec-type: tokens per draft")
      ->check(CLI::Range(1, 64));
  app.add_option("--spec-ngram-size", a.ngram.n_max,
                 "--spec-type ngram: the longest suffix looked up (default 3)")
      ->check(CLI::Range(1, 64));
  app.add_option("--spec-ngram-min", a.ngram.n_min,
                 "--spec-type ngram: the shortest suffix that counts as a match (default 1)")
      ->check(CLI::Range(1, 64));
}

// The drafter --spec-type names (not none); mtp's follows sequences of up to n_ctx positions.
inline model::Drafter make_drafter(const SpecArgs& a, model::ModelArch& m, int64_t n_ctx) {
  if (a.type == "mtp") return model::mtp_drafter(m, n_ctx, a.ngram.draft_max);
  return model::ngram_drafter(a.ngram);
}

// CLI::ValidationError for options that contradict each other.
inline void check_spec_args(const SpecArgs& a) {
  if (a.ngram.n_min > a.ngram.n_max) {
    throw CLI::ValidationError("--spec-ngram-min is above --spec-ngram-size");
  }
}

}  // namespace moe::tools
