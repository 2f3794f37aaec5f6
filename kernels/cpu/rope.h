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

// YaRN context extension (gpt-oss) as llama.cpp applies it: pair i's angle mixes the interpolated
// angle freq_scale * theta_i and the original theta_i by a ramp over the pairs between corr_low
// and corr_high (high frequencies keep their angle, low ones are interpolated), and cos/sin are
// scaled by mscale, the attention magnitude factor (q and k each carry it, so q·k carries its
// square). With ext_factor 0 only the linear interpolation (freq_scale) remains.
struct RopeYarn {
  float freq_scale = 1.0f;                  // 1 / rope.scaling.factor
  float ext_factor = 0.0f;                  // 1 for YaRN, 0 for linear scaling
  float mscale = 1.0f;                      // cos/sin multiplier
  float corr_low = 0.0f, corr_high = 0.0f;  // ramp ends, in pairs
};

// The parameters llama.cpp derives for a model: `factor` (rope.scaling.factor, >= 1), the
// original training context, beta_fast/beta_slow (32 and 1 by default) and rope.scaling.attn_factor
// (1 by default). `yarn` false gives linear scaling by 1/factor (no ramp, mscale 1).
RopeYarn rope_yarn_params(int64_t n_rot, float freq_base, float factor, int64_t n_ctx_orig,
                          float beta_fast, float beta_slow, float attn_factor, bool yarn);

// rope_angles with YaRN (or linear) scaling, in the same float arithmetic as ggml's rope cache.
void rope_angles_yarn(int64_t pos, int64_t n_rot, float freq_base, const RopeYarn& y, float* cs);

// Rotates n_heads heads of head_dim values (contiguous) in place using angles from rope_angles.
void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float* cs);

}  // namespace moe::model
