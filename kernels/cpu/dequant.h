// Scalar reference dequantization of every computable ggml type (formats.md §2.3).
#pragma once

#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cpu {

// IQ4_NL's non-linear 4-bit values (ggml's kvalues_iq4nl): its weights' decoder and the KV cache's
// iq4_nl encoder (kv_quant.cpp) share them.
inline constexpr int8_t kValuesIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// Writes n floats decoded from `src` (n must be a multiple of the type's block size; throws
// moe::Error otherwise or when the type is not computable). Bit-exact with ggml's to_float.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace moe::cpu
