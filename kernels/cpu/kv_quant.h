// How a KV cache row is stored: F32 as is, F16 and BF16 round-to-nearest-even, Q8_0, Q4_0, Q4_1,
// Q5_0 and Q5_1 as ggml's reference quantizers define them (quantize_row_*_ref). The CPU cache
// stores rows with it, and the GPU's kv_store is tested byte for byte against it.
#pragma once

#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cpu {

// Encodes n floats (a whole number of the type's blocks) into dst; moe::Error for other types.
void encode_kv_row(GgmlType type, const float* x, uint8_t* dst, int64_t n);

}  // namespace moe::cpu
