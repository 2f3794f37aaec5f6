// Expert choices recorded by a golden run (moe_topk_L.i32 for the prompt batch, gen_moe_topk_L.i32
// for the decode steps), replayed through ForwardHooks::force_experts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/model/model_arch.h"

namespace moe::model {

class ForcedRouting {
 public:
  // Reads every layer's files from `dir`; the prompt file defines n_prompt. Decode files are
  // optional (absent: only prompt positions are forced). Throws moe::Error on missing or
  // malformed files.
  ForcedRouting(const std::string& dir, int64_t n_layer, int64_t n_expert_used);

  int64_t n_prompt() const { return n_prompt_; }
  // Experts of (layer, pos): prompt rows for pos < n_prompt, decode rows after. False if unknown.
  bool lookup(int64_t layer, int64_t pos, int32_t* experts) const;
  // Hooks that force every known (layer, pos).
  ForwardHooks hooks() const;

 private:
  int64_t k_;
  int64_t n_prompt_ = 0;
  std::vector<std::vector<int32_t>> prompt_, decode_;  // [layer][row * k]
};

}  // namespace moe::model
