// Scalar reference dequantization of every computable ggml type (formats.md §2.3).
#pragma once

#include <cstdint>

#include "common/ggml_type.h"

namespace moe::cpu {

// Writes n floats decoded from `src` (n must be a multiple of the type's block size; throws
// moe::Error otherwise or when the type is not computable). Bit-exact with ggml's to_float.
void dequantize_row(GgmlType type, const void* src, float* dst, int64_t n);

}  // namespace moe::cpu
