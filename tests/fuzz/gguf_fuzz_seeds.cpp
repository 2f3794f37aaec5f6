// Writes a few small valid GGUF images (the fuzzer's starting corpus) into the directory argv[1].
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/gguf.h"
#include "tests/gguf_builder.h"

namespace {

using moe::GgmlType;
using moe::gguf::ValueType;
using moe::test::GgufBuilder;

GgufBuilder tokenizer_model() {
  GgufBuilder b;
  b.kv_string("general.architecture", "qwen3moe")
      .kv_u32("general.alignment", 32)
      .kv_u32("qwen3moe.block_count", 1)
      .kv_f32("qwen3moe.rope.freq_base", 1e6f)
      .kv_string("tokenizer.ggml.model", "gpt2")
      .kv_string_array("tokenizer.ggml.tokens", {"a", "b", "ab", "<|endoftext|>"})
      .kv_array<int32_t>("tokenizer.ggml.token_type", ValueType::I32, {1, 1, 1, 3})
      .kv_string_array("tokenizer.ggml.merges", {"a b"})
      .kv_u32("tokenizer.ggml.bos_token_id", 3)
      .kv_u32("tokenizer.ggml.eos_token_id", 3)
      .kv_bool("tokenizer.ggml.add_bos_token", false);
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);

  std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;

  seeds.emplace_back("empty_v3", GgufBuilder().build());
  seeds.emplace_back("vocab_only", tokenizer_model().build());

  {
    auto b = tokenizer_model();
    b.add_tensor("token_embd.weight", GgmlType::Q4_0, {32, 4})
        .add_tensor("blk.0.attn_norm.weight", GgmlType::F32, {32})
        .add_tensor("blk.0.ffn_down_exps.weight", GgmlType::Q2_0, {64, 2, 2})
        .add_tensor("blk.0.ffn_up_exps.weight", GgmlType::Q4_K, {256, 1, 2})
        .add_tensor("output.weight", GgmlType::Q8_0, {32, 4});
    seeds.emplace_back("tiny_model", b.build());
  }
  {
    GgufBuilder b;
    b.version(2)
        .kv_u8("u8", 1)
        .kv_i8("i8", -1)
        .kv_u16("u16", 2)
        .kv_i16("i16", -2)
        .kv_u32("u32", 3)
        .kv_i32("i32", -3)
        .kv_u64("u64", 4)
        .kv_i64("i64", -4)
        .kv_f32("f32", 0.5f)
        .kv_f64("f64", 0.25)
        .kv_bool("bool", true)
        .kv_string("string", "s")
        .kv_array<uint16_t>("arr.u16", ValueType::U16, {1, 2})
        .kv_array<double>("arr.f64", ValueType::F64, {1.0})
        .kv_array<uint8_t>("arr.bool", ValueType::BOOL, {1, 0})
        .alignment(64);
    b.add_tensor("a", GgmlType::F16, {4, 2, 2, 2}).add_tensor("b", GgmlType::BF16, {3});
    seeds.emplace_back("all_types_v2", b.build());
  }
  {
    GgufBuilder b;
    b.kv_u16("split.no", 0).kv_u16("split.count", 2).kv_i32("split.tensors.count", 2);
    b.add_tensor("x", GgmlType::Q6_K, {256});
    seeds.emplace_back("split_shard", b.build());
  }

  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / (name + ".gguf"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", (dir / name).c_str());
      return 1;
    }
  }
  std::printf("wrote %zu seeds to %s\n", seeds.size(), dir.c_str());
  return 0;
}
