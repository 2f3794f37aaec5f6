#include "kernels/cpu/causal_conv.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/activations.h"

namespace moe::model {

void causal_conv1d(const CausalConvShape& s, const float* x, int64_t n_tokens, const float* w,
                   const float* state_in, float* state_out, float* out, bool silu_out,
                   cpu::ThreadPool& pool) {
  const int64_t C = s.channels, K = s.kernel, H = K - 1;
  // Input row j of the combined sequence [window, batch]: j < 0 reads the window.
  const auto row = [&](int64_t j) -> const float* {
    if (j >= 0) return x + j * C;
    return state_in ? state_in + (H + j) * C : nullptr;
  };
  // Channel chunks: contiguous within every row, so the inner loops vectorize.
  constexpr int64_t kChunk = 256;
  const int64_t n_chunks = (C + kChunk - 1) / kChunk;
  pool.parallel_for(n_chunks, [&](int64_t task, int) {
    const int64_t c0 = task * kChunk, nc = std::min(kChunk, C - c0);
    for (int64_t t = 0; t < n_tokens; ++t) {
      float* o = out + t * C + c0;
      std::fill(o, o + nc, 0.0f);
      for (int64_t i = 0; i < K; ++i) {
        const float* in = row(t - H + i);
        if (!in) continue;  // zeros contribute nothing
        const float* wi = w + i * C + c0;
        in += c0;
        for (int64_t c = 0; c < nc; ++c) o[c] += in[c] * wi[c];
      }
      if (silu_out) {
        for (int64_t c = 0; c < nc; ++c) o[c] = silu(o[c]);
      }
    }
    for (int64_t r = 0; r < H; ++r) {
      const float* in = row(n_tokens - H + r);
      float* so = state_out + r * C + c0;
      if (in) {
        std::memcpy(so, in + c0, static_cast<size_t>(nc) * sizeof(float));
      } else {
        std::fill(so, so + nc, 0.0f);
      }
    }
  });
}

}  // namespace moe::model
