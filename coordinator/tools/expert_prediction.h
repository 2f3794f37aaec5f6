// Next-layer expert prediction, measured (issue 29 §2): would layer l+1's router, applied to the
// hidden state layer l already has, name the experts layer l+1 will pick? If so, their copies into
// VRAM (or the CPU's pages) could start a layer early. For every token and layer l+1 >= 1 of a
// prompt, the router of l+1 is applied to layer l's residual stream after its experts (l_out) and,
// where the architecture keeps it, after its attention (a longer lead: before l's experts),
// normed by l+1's MoE norm, and its top k (and top 2k) compared with what l+1 really picks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "coordinator/model/model_arch.h"

namespace moe::tools {

struct PredictionRow {
  int64_t layer = 0;  // the predicted layer, l + 1
  // Of the experts it picks: the share among the top k (hit) and the top 2k (recall2) predicted
  // from l_out, and from the residual after attention (-1 where the architecture has none).
  double hit_out = 0, recall2_out = 0, hit_attn = -1, recall2_attn = -1;
};

// Runs `tokens` through `model` as one batch (host routing, the hooks observe every layer) and
// measures the prediction for every layer after the first. moe::Error for a model whose router
// or MoE norm tensors are not where the architecture has them.
std::vector<PredictionRow> measure_expert_prediction(model::ModelArch& model,
                                                     const gguf::GgufFile& file,
                                                     std::span<const int32_t> tokens);

// The rows as a markdown table, then the mean over layers and what k (2k) random experts of
// n_expert would find.
std::string prediction_table(const std::vector<PredictionRow>& rows, int64_t k, int64_t n_expert);

}  // namespace moe::tools
