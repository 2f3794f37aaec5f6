// Weight quantizers: float rows into the ggml block formats that GGUF models store, so synthetic
// models can have the type mix of real Q4_K_M/Q5_K_M/Q6_K files. These are simple, bounded
// quantizers (no llama.cpp-style iterative scale search): every element's error is at most half a
// quantization step of its sub-block, plus the rounding of the 6/8-bit sub-block scales.
#pragma once

#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cpu {

// True for the types quantize_weight_row can write: F32, F16, BF16, Q8_0, Q5_0, Q4_K, Q5_K, Q6_K,
// MXFP4.
bool can_quantize_weight(GgmlType type);

// Writes n floats as type `type` into dst (row_bytes(type, n) bytes). n must be a multiple of the
// type's block size. Throws moe::Error for an unsupported type or a bad n.
void quantize_weight_row(GgmlType type, const float* x, void* dst, int64_t n);

}  // namespace moe::cpu
