#include "kernels/cpu/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace moe::model {

void rope_angles(int64_t pos, int64_t n_rot, float freq_base, float* cs) {
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(n_rot));
  float theta = static_cast<float>(pos);
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    cs[2 * i] = std::cos(theta);
    cs[2 * i + 1] = std::sin(theta);
    theta *= theta_scale;
  }
}

void rope_angles_imrope(int64_t pos, int64_t n_rot, float freq_base, const int64_t* sections,
                        float* cs) {
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(n_rot));
  const int64_t sect_dims = sections[0] + sections[1] + sections[2] + sections[3];
  float theta_thw = static_cast<float>(pos);  // components t, h and w; e is 0 for text
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const int64_t sector = i % sect_dims;
    const bool thw = (sector % 3 == 1 && sector < 3 * sections[1]) ||
                     (sector % 3 == 2 && sector < 3 * sections[2]) ||
                     (sector % 3 == 0 && sector < 3 * sections[0]);
    const float theta = thw ? theta_thw : 0.0f;
    cs[2 * i] = std::cos(theta);
    cs[2 * i + 1] = std::sin(theta);
    theta_thw *= theta_scale;
  }
}

namespace {

// The pair index at which a rotation of `beta` full turns spans the original context.
float yarn_corr_dim(int64_t n_rot, int64_t n_ctx_orig, float beta, float base) {
  return static_cast<float>(n_rot) *
         std::log(static_cast<float>(n_ctx_orig) / (beta * 2 * std::numbers::pi_v<float>)) /
         (2 * std::log(base));
}

}  // namespace

RopeYarn rope_yarn_params(int64_t n_rot, float freq_base, float factor, int64_t n_ctx_orig,
                          float beta_fast, float beta_slow, float attn_factor, bool yarn) {
  RopeYarn y;
  y.freq_scale = 1.0f / factor;
  if (!yarn) return y;
  y.ext_factor = 1.0f;
  // llama.cpp's context sets its attention factor to get_mscale(factor) / (1 + 0.1 ln factor)
  // (about 1), and its rope multiplies by 1 + 0.1 ln(1 / freq_scale) again: the product, in the
  // same float steps, is what cos and sin carry.
  const float f = 1.0f / y.freq_scale;
  float attn = f <= 1.0f ? 1.0f : 0.1f * std::log(f) + 1.0f;
  attn *= 1.0f / (1.0f + 0.1f * std::log(f));
  attn *= attn_factor;
  y.mscale = attn * (1.0f + 0.1f * std::log(1.0f / y.freq_scale));
  y.corr_low = std::max(0.0f, std::floor(yarn_corr_dim(n_rot, n_ctx_orig, beta_fast, freq_base)));
  y.corr_high = std::min(static_cast<float>(n_rot - 1),
                         std::ceil(yarn_corr_dim(n_rot, n_ctx_orig, beta_slow, freq_base)));
  return y;
}

void rope_angles_yarn(int64_t pos, int64_t n_rot, float freq_base, const RopeYarn& y, float* cs) {
  const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(n_rot));
  const float span = std::max(0.001f, y.corr_high - y.corr_low);
  float theta_extrap = static_cast<float>(pos);
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const float theta_interp = y.freq_scale * theta_extrap;
    float theta = theta_interp;
    if (y.ext_factor != 0.0f) {
      // 1 below corr_low (keep the original angle), 0 above corr_high (interpolate).
      const float ramp =
          1.0f - std::min(1.0f, std::max(0.0f, (static_cast<float>(i) - y.corr_low) / span));
      const float mix = ramp * y.ext_factor;
      theta = theta_interp * (1 - mix) + theta_extrap * mix;
    }
    cs[2 * i] = std::cos(theta) * y.mscale;
    cs[2 * i + 1] = std::sin(theta) * y.mscale;
    theta_extrap *= theta_scale;
  }
}

void rope_neox(float* x, int64_t n_heads, int64_t head_dim, int64_t n_rot, const float* cs) {
  const int64_t half = n_rot / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cs[2 * i], s = cs[2 * i + 1];
      const float x0 = v[i], x1 = v[i + half];
      v[i] = x0 * c - x1 * s;
      v[i + half] = x0 * s + x1 * c;
    }
  }
}

}  // namespace moe::model
