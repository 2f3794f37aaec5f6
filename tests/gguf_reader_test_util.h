// Shared by the gguf_reader_test sources: the in-memory parse helper and a small valid model.
#pragma once

#include <cstdint>
#include <vector>

#include "common/gguf.h"
#include "tests/gguf_builder.h"

// A named namespace with inline definitions: both test sources use these, and each uses only
// some of them (an unnamed namespace in a header would warn about the unused ones).
namespace moe::gguf::reader_test {

using moe::test::GgufBuilder;
using VT = ValueType;

inline constexpr uint32_t kF32 = static_cast<uint32_t>(GgmlType::F32);
inline constexpr uint32_t kI8 = static_cast<uint32_t>(GgmlType::I8);
inline constexpr uint32_t kQ4_0 = static_cast<uint32_t>(GgmlType::Q4_0);
inline constexpr uint32_t kQ2_0 = static_cast<uint32_t>(GgmlType::Q2_0);

inline GgufFile parse(const std::vector<uint8_t>& bytes) {
  return GgufFile::parse(bytes, "test.gguf");
}
GgufFile parse(std::vector<uint8_t>&& bytes) = delete;  // the result would point into a temporary

// A small valid model: metadata with a tokenizer, and two tensors of different types.
inline GgufBuilder base() {
  GgufBuilder b;
  b.kv_string("general.architecture", "qwen3moe")
      .kv_u32("qwen3moe.block_count", 4)
      .kv_string_array("tokenizer.ggml.tokens", {"a", "b", "<s>", "[PAD3]"})
      .kv_array<int32_t>("tokenizer.ggml.token_type", VT::I32, {1, 1, 3, 5})
      .kv_u32("tokenizer.ggml.bos_token_id", 2);
  b.tensor("token_embd.weight", kQ4_0, {32, 4});
  b.tensor("output_norm.weight", kF32, {8});
  return b;
}

}  // namespace moe::gguf::reader_test
