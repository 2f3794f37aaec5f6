// How a KV cache row is stored: F32 as is, F16 round-to-nearest-even, Q8_0 and Q4_0 as ggml's
// reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref). The CPU cache stores rows
// with it, and the GPU's kv_store is tested byte for byte against it.
#pragma once

#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cpu {

// Encodes n floats (a whole number of the type's blocks) into dst; moe::Error for other types.
void encode_kv_row(GgmlType type, const float* x, uint8_t* dst, int64_t n);

}  // namespace moe::cpu
