// ggml tensor type ids as stored in GGUF files, with their block geometry.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace moe {

// Values are the on-disk ids (ggml.h, mainline Aug 2026); gaps are ids that ggml removed.
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
  MXFP4 = 39,
  NVFP4 = 40,
  Q1_0 = 41,
  Q2_0 = 42,
};

struct GgmlTypeInfo {
  std::string_view name;  // ggml's lower-case name, e.g. "q4_K"
  uint32_t block_size;    // elements per block
  uint32_t type_size;     // bytes per block
  bool computable;        // we can dequantize it and multiply with it
};

// Geometry of a known id; nullopt for ids ggml never had or removed.
std::optional<GgmlTypeInfo> ggml_type_info(uint32_t id);

// "q4_K (id 12)" for known ids, "unknown (id 77)" otherwise: for error messages.
std::string ggml_type_label(uint32_t id);

// Bytes of one row of `n` elements, or nullopt if n is not a multiple of the block size or
// overflows.
std::optional<uint64_t> ggml_row_bytes(GgmlType type, uint64_t n);

// Info for a type that must be known (internal callers); throws moe::Error otherwise.
const GgmlTypeInfo& ggml_type_info_or_throw(GgmlType type);

}  // namespace moe
