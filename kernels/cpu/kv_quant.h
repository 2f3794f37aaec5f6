// How a KV cache row is stored: F32 as is, F16 and BF16 round-to-nearest-even, Q8_0, Q4_0, Q4_1,
// Q5_0 and Q5_1 as ggml's reference quantizers define them (quantize_row_*_ref), IQ4_NL in ggml's
// block layout by this project's own rule (kv_quant.cpp). The CPU cache stores rows with it, and
// the GPU's kv_store is tested byte for byte against it.
#pragma once

#include <cstdint>

#include "common/ggml_type.h"
#include "kernels/cpu/cpu_features.h"

namespace moe::cpu {

// Encodes n floats (a whole number of the type's blocks) into dst; moe::Error for other types.
void encode_kv_row(GgmlType type, const float* x, uint8_t* dst, int64_t n);

// Decodes n_rows cache rows (row i at src + i * row_bytes, elems values each) into dst
// (n_rows * elems floats), bit for bit as dequantize_row; F16 rows through F16C where `isa` has
// AVX2 (the attention reads every row of the cache each decode step, and the scalar conversion
// cost more than the attention itself).
void decode_kv_rows(GgmlType type, const uint8_t* src, size_t row_bytes, int64_t n_rows,
                    int64_t elems, float* dst, Isa isa);

}  // namespace moe::cpu
