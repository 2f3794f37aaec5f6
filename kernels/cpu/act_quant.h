// Activation formats that weights are multiplied against, as llama.cpp's CPU backend does
// ("vec_dot_type"): the activation row is converted once, then every weight row is dotted with it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/ggml_type.h"
#include "kernels/cpu/cpu_features.h"

namespace moe::cpu {

enum class ActFormat { F32, F16, BF16, Q8_0, Q8_1, Q8_K, Q8_0U4 };

// Block layouts, byte-identical to ggml's block_q8_0 / block_q8_1 / block_q8_K.
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[32];
};
struct BlockQ8_1 {
  uint16_t d;  // fp16 scale
  uint16_t s;  // fp16 of d * sum(qs)
  int8_t qs[32];
};
struct BlockQ8_K {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sums of each group of 16 qs
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ8_1) == 36 && sizeof(BlockQ8_K) == 292);

// Q8_0U4 (ours, for MXFP4 weights): Q8_0's values (same d and qs) laid out for the MXFP4 SIMD
// kernels (simd/dot_mxfp4.inc), which then need no sign flips, byte shuffles or scale gathers per
// activation row. Groups of 4 blocks (A, B, C, D; 128 elements) of 160 bytes: 128 bytes of
// qs + 128 as u8 (the kernels multiply them as unsigned bytes with the signed weights), then the
// 4 block scales d as floats in the order (dA, dB, dA, dB, dC, dD, dC, dD). (Storing corrections
// for signed activations instead made the groups 224 bytes: 8 rows of 4096 then outgrew L1 and
// ran at half speed.) Within the 128 bytes, 4 consecutive elements of
// one block stay together (one 32-bit lane): element e of block j is at byte
// 32 * (2 * (e / 16) + (e % 16) / 8) + 16 * (j / 2) + 8 * ((e % 8) / 4) + 4 * (j % 2) + e % 4
// (act_q8_0u4_offset). A row's last group is padded to 4 blocks (qs 128, d 0: value 0).
inline constexpr int64_t kQ8_0U4GroupBytes = 160;
inline constexpr int64_t kQ8_0U4GroupQs = 128;  // byte offset of the scales in a group
inline constexpr int act_q8_0u4_offset(int j, int e) {
  return 32 * (2 * (e / 16) + (e % 16) / 8) + 16 * (j / 2) + 8 * ((e % 8) / 4) + 4 * (j % 2) +
         e % 4;
}

// The activation format llama.cpp uses for weights of `type` (F32 weights -> F32, F16 -> F16,
// BF16 -> BF16, K-quants and IQ4_XS -> Q8_K, Q4_1/Q5_1 -> Q8_1, other 32/64-blocks -> Q8_0), but
// MXFP4 -> Q8_0U4 (Q8_0's values in another layout).
ActFormat act_format_for(GgmlType type);

// Elements per activation block (1 for float formats).
int64_t act_block_size(ActFormat f);

// Bytes of one activation row of n elements (n a multiple of act_block_size).
size_t act_row_bytes(ActFormat f, int64_t n);

// Scalar reference conversion of n floats into format f (same rounding as llama.cpp's
// quantize_row_*_ref).
void quantize_act_row_ref(ActFormat f, const float* x, void* dst, int64_t n);

// The same bytes as quantize_act_row_ref, faster where `isa` has a path (Q8_K with AVX2).
void quantize_act_row(ActFormat f, const float* x, void* dst, int64_t n, Isa isa);

// Reference decode of an activation row back to floats (for tests and the scalar dot path).
void dequantize_act_row(ActFormat f, const void* src, float* dst, int64_t n);

}  // namespace moe::cpu
