// Scalar activations with llama.cpp's (ggml CPU) definitions.
#pragma once

#include <cmath>

namespace moe::model {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

// ggml_softplus returns x itself above 20, where log(1 + e^x) == x in float anyway.
inline float softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

}  // namespace moe::model
