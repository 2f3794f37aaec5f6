#include "kernels/cpu/rope.h"

#include <cmath>

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
