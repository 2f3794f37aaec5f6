// Rotary position embedding, NEOX layout: dimension i is paired with i + n_rot/2, angle
// theta_i = pos * base^(-2i/n_rot); dimensions >= n_rot pass through.
#pragma once

#include <cstdint>

namespace moe::model {

// Fills cs[2*i] = cos(theta_i), cs[2*i+1] = sin(theta_i) for i < n_rot/2. The angle is built by
// repeated float multiplication, as ggml's rope cache does, so results match it closely.
void rope_angles(int64_t pos, int64_t n_rot, float freq_base, float* cs);

// IMROPE (qwen35moe, ggml's interleaved multi-section RoPE) for text tokens: pair i takes its
// position from component t, h, w (all = pos for text) or e (0) by `sections` (4 entries), as
// ggml's mrope cache does. With sections covering every pair this is rope_angles.
void rope_angles_imrope(int64_t pos, int64_t n_rot, float freq_base, const int64_t* sections,
                        float* cs);

// Rotates n_heads heads of head_dim values (contiguous) in place using angles from rope_angles.
void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float* cs);

}  // namespace moe::model
