// Drafts from the model's own multi-token-prediction block (Qwen3.5/3.6's MTP, llama.cpp's
// draft-mtp). The block keeps a cache of its own attention layer that follows the target: after
// every target forward it is caught up on the forward's tokens, each paired with the target's
// hidden state at the position before (so its row at position p reads token p and the target's
// state after p - 1); to draft, it runs on the token the target chose with the target's last
// state, then on each drafted token with its own state, taking the most likely token each time.
// A wrong draft only costs its verification: the chosen tokens are the target's either way.
#pragma once

#include <cstdint>
#include <vector>

#include "coordinator/model/model_arch.h"
#include "coordinator/model/speculative.h"

namespace moe::model {

// Up to `draft_max` tokens per draft, for sequences of up to n_ctx positions; `model` must have an
// MTP block (moe::Error otherwise) and outlive the drafter. `last_logits` (tests): when not null,
// each draft step's logits are copied there.
Drafter mtp_drafter(ModelArch& model, int64_t n_ctx, int draft_max,
                    std::vector<float>* last_logits = nullptr);

}  // namespace moe::model
