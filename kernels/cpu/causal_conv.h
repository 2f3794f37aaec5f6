// Depthwise causal conv1d over a batch of tokens that continues a sequence (ggml_ssm_conv): every
// channel convolves its last `kernel` inputs with its own taps, the current token last.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace moe::model {

struct CausalConvShape {
  int64_t channels = 0;
  int64_t kernel = 0;  // taps, the current token included
};

// x: [n_tokens][channels] new inputs. w: [kernel][channels], tap-major (tap kernel-1 multiplies
// the current token). state_in: [kernel-1][channels], the previous inputs oldest first, or null for
// zeros (start of a sequence). Writes out[t][c] = sum_i in(t - kernel + 1 + i)[c] * w[i][c]
// (summed in tap order, as ggml), SiLU'd when `silu`, and the batch's last kernel-1 inputs to
// state_out, which must not alias state_in or x.
void causal_conv1d(const CausalConvShape& s, const float* x, int64_t n_tokens, const float* w,
                   const float* state_in, float* state_out, float* out, bool silu,
                   cpu::ThreadPool& pool);

}  // namespace moe::model
