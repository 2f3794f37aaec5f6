// GgufWriter output read back by GgufFile, and moe-synth's output as a qwen3moe model.
#include "common/gguf_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <type_traits>
#include <variant>

#include "common/error.h"
#include "common/gguf.h"

namespace moe::gguf {
namespace {

std::filesystem::path temp_path(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         (name + "-" + std::to_string(::getpid()) + ".gguf");
}

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  GgufWriter w(64);
  w.set_u32("a.u32", 7);
  w.set_i32("a.i32", -3);
  w.set_u64("a.u64", 1ull << 40);
  w.set_f32("a.f32", 0.5f);
  w.set_bool("a.bool", true);
  w.set_string("a.str", "héllo");
  w.set_strings("a.strs", {"x", "", "yz"});
  w.set_i32s("a.i32s", {1, -2, 3});
  w.set_f32s("a.f32s", {1.5f, -2.5f});
  w.add_tensor("t0", GgmlType::F32, {5, 3});
  w.add_tensor("t1", GgmlType::Q8_0, {64, 2});
  const auto path = temp_path("writer");
  w.write(path, [](size_t i, uint8_t* dst, uint64_t n) {
    for (uint64_t j = 0; j < n; ++j) dst[j] = static_cast<uint8_t>(i * 31 + j);
  });
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.require_uint("a.u32"), 7u);
  EXPECT_EQ(f.require_uint("a.u64"), 1ull << 40);
  EXPECT_FLOAT_EQ(static_cast<float>(f.require_float("a.f32")), 0.5f);
  EXPECT_TRUE(f.require_bool("a.bool"));
  EXPECT_EQ(f.require_string("a.str"), "héllo");
  const auto& strs = f.require_array("a.strs");
  ASSERT_EQ(strs.count, 3u);
  EXPECT_EQ(strs.string_at(2), "yz");
  EXPECT_EQ(f.require_array("a.i32s").int_at(1), -2);
  EXPECT_DOUBLE_EQ(f.require_array("a.f32s").float_at(1), -2.5);
  ASSERT_EQ(f.tensors().size(), 2u);
  const TensorInfo* t1 = f.find_tensor("t1");
  ASSERT_NE(t1, nullptr);
  EXPECT_EQ(t1->n_bytes, 2u * 2u * 34u);
  EXPECT_EQ(t1->offset % 64, 0u);
  EXPECT_EQ(t1->data[5], static_cast<uint8_t>(31 + 5));
  std::filesystem::remove(path);
}

// copy_value re-encodes every value of one file into another, types included.
TEST(GgufWriter, CopyValueKeepsTypesAndContents) {
  GgufWriter w;
  w.set_u32("a.u32", 7);
  w.set_i32("a.i32", -3);
  w.set_u64("a.u64", 1ull << 40);
  w.set_f32("a.f32", 0.25f);
  w.set_bool("a.bool", false);
  w.set_string("a.str", "tokenizer");
  w.set_strings("a.strs", {"x", "", "yz"});
  w.set_i32s("a.i32s", {1, -2, 3});
  w.set_f32s("a.f32s", {1.5f, -2.5f});
  const auto first = temp_path("copy-src"), second = temp_path("copy-dst");
  w.write(first, [](size_t, uint8_t*, uint64_t) {});
  const GgufFile a = GgufFile::open(first);
  GgufWriter c;
  for (const auto& kv : a.metadata()) c.copy_value(std::string(kv.key), kv.value);
  c.write(second, [](size_t, uint8_t*, uint64_t) {});
  const GgufFile b = GgufFile::open(second);
  ASSERT_EQ(a.metadata().size(), b.metadata().size());
  for (const auto& kv : a.metadata()) {
    const Value* v = b.find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(v->type, kv.value.type) << kv.key;
    if (v->type != ValueType::ARRAY) {
      ASSERT_EQ(v->v.index(), kv.value.v.index()) << kv.key;
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (!std::is_same_v<T, ArrayValue>) {
              EXPECT_EQ(x, std::get<T>(v->v));
            }
          },
          kv.value.v);
      continue;
    }
    const auto& x = std::get<ArrayValue>(kv.value.v);
    const auto& y = std::get<ArrayValue>(v->v);
    EXPECT_EQ(x.elem_type, y.elem_type);
    ASSERT_EQ(x.count, y.count);
    for (uint64_t i = 0; i < x.count; ++i) {
      if (x.elem_type == ValueType::STRING) {
        EXPECT_EQ(x.string_at(i), y.string_at(i));
      } else {
        EXPECT_EQ(x.float_at(i), y.float_at(i));
      }
    }
  }
  std::filesystem::remove(first);
  std::filesystem::remove(second);
}

TEST(GgufWriter, RejectsBadInputAndLeavesNoPartialFile) {
  GgufWriter w;
  w.set_u32("k", 1);
  EXPECT_THROW(w.set_u32("k", 2), Error);
  EXPECT_THROW(w.add_tensor("q", GgmlType::Q4_K, {128, 2}), Error);  // not a 256-multiple
  EXPECT_THROW(w.add_tensor("z", GgmlType::F32, {0}), Error);
  EXPECT_THROW(GgufWriter(3), Error);
  w.add_tensor("t", GgmlType::F32, {4});
  const auto path = temp_path("writer-fail");
  EXPECT_THROW(w.write(path, [](size_t, uint8_t*, uint64_t) { throw Error("fill failed"); }),
               Error);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".partial"));
}

TEST(MoeSynth, WritesALoadableQwen3MoeModel) {
  const auto path = temp_path("synth");
  const std::string cmd = std::string(MOE_BIN_DIR) +
                          "/moe-synth --preset tiny --quant q8_0 --layers 3 -o " + path.string() +
                          " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.require_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(f.require_uint("qwen3moe.block_count"), 3u);
  const uint64_t n_embd = f.require_uint("qwen3moe.embedding_length");
  const uint64_t n_exp = f.require_uint("qwen3moe.expert_count");
  const TensorInfo* down = f.find_tensor("blk.2.ffn_down_exps.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type(), GgmlType::Q8_0);
  EXPECT_EQ(static_cast<uint64_t>(down->ne[1]), n_embd);
  EXPECT_EQ(static_cast<uint64_t>(down->ne[2]), n_exp);
  EXPECT_EQ(f.require_array("tokenizer.ggml.tokens").count % 64, 0u);
  EXPECT_EQ(f.tensors().size(), 3u * 12u + 3u);
  std::filesystem::remove(path);
}

// The K-quant mix, skew and shape flags through the command line; bad values exit non-zero.
TEST(MoeSynth, KQuantMixAndUsageErrors) {
  const auto path = temp_path("synth-k");
  const std::string bin = std::string(MOE_BIN_DIR) + "/moe-synth";
  const std::string cmd = bin +
                          " --quant q4_k_m --skew 0.8 --layers 2 --n-embd 256 --n-ff-exp 256 -o " +
                          path.string() + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.require_uint("general.file_type"), 15u);
  EXPECT_EQ(f.find_tensor("blk.0.attn_q.weight")->type(), GgmlType::Q4_K);
  EXPECT_EQ(f.find_tensor("blk.1.ffn_down_exps.weight")->type(), GgmlType::Q6_K);
  EXPECT_EQ(f.find_tensor("output.weight")->type(), GgmlType::Q6_K);
  std::filesystem::remove(path);
  for (const char* bad :
       {"--preset huge", "--quant q3_k", "--skew -1", "--vocab-from /nonexistent"}) {
    const std::string c = bin + " " + bad + " -o " + path.string() + " > /dev/null 2>&1";
    EXPECT_NE(std::system(c.c_str()), 0) << bad;
    EXPECT_FALSE(std::filesystem::exists(path)) << bad;
  }
}

}  // namespace
}  // namespace moe::gguf
