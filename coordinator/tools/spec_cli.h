// The speculative-decoding flags moe-run and moe-bench share, as llama.cpp spells them:
// --spec-type none|ngram, --draft-max (--draft), --spec-ngram-size, --spec-ngram-min.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "coordinator/model/ngram_draft.h"

namespace moe::tools {

struct SpecArgs {
  std::string type = "none";  // none | ngram
  moe::model::NgramDraftOptions ngram;
};

// `what_for` says which test or mode the drafts serve (in the help).
inline void add_spec_options(CLI::App& app, SpecArgs& a, const std::string& what_for) {
  app.add_option("--spec-type", a.type,
                 what_for +
                     ": none, or ngram (draft from earlier text, verify in one batch; on the CPU "
                     "the tokens are the same as without)")
      ->check(CLI::IsMember({"none", "ngram"}));
  app.add_option("--draft-max,--draft", a.ngram.draft_max, "--spec-type ngram: tokens per draft")
      ->check(CLI::Range(1, 64));
  app.add_option("--spec-ngram-size", a.ngram.n_max,
                 "--spec-type ngram: the longest suffix looked up (default 3)")
      ->check(CLI::Range(1, 64));
  app.add_option("--spec-ngram-min", a.ngram.n_min,
                 "--spec-type ngram: the shortest suffix that counts as a match (default 1)")
      ->check(CLI::Range(1, 64));
}

// CLI::ValidationError for options that contradict each other.
inline void check_spec_args(const SpecArgs& a) {
  if (a.ngram.n_min > a.ngram.n_max) {
    throw CLI::ValidationError("--spec-ngram-min is above --spec-ngram-size");
  }
}

}  // namespace moe::tools
