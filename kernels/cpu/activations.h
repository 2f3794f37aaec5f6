// Scalar activations with llama.cpp's (ggml CPU) definitions.
#pragma once

#include <algorithm>
#include <cmath>

namespace moe::model {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// gpt-oss's expert GLU (ggml_swiglu_oai with llama.cpp's alpha 1.702 and limit 7): the gate is
// clamped from above, the linear part from both sides and shifted by one.
inline constexpr float kSwigluOaiAlpha = 1.702f;
inline constexpr float kSwigluOaiLimit = 7.0f;
inline float swiglu_oai(float g, float u, float alpha = kSwigluOaiAlpha,
                        float limit = kSwigluOaiLimit) {
  const float x = std::min(g, limit);
  const float y = std::clamp(u, -limit, limit);
  return x / (1.0f + std::exp(alpha * (-x))) * (y + 1.0f);
}

// ggml_softplus returns x itself above 20, where log(1 + e^x) == x in float anyway.
inline float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

}  // namespace moe::model
