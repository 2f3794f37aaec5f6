// GGUF reader: round trips through the in-memory builder, accessors, and files on disk (split
// models). Corrupt input is in gguf_reader_corrupt_test.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "tests/gguf_builder.h"
#include "tests/gguf_reader_test_util.h"

namespace moe::gguf {
namespace {

using moe::test::GgufBuilder;
using reader_test::base;
using reader_test::kF32;
using reader_test::kQ2_0;
using reader_test::kQ4_0;
using reader_test::parse;
using VT = ValueType;

void parses(const std::vector<uint8_t>& bytes) { (void)parse(bytes); }

// ---------------------------------------------------------------------------------------------
// Round trips

class RoundTrip : public ::testing::TestWithParam<uint32_t> {};

TEST_P(RoundTrip, EveryValueTypeAndTensorLayout) {
  const uint32_t version = GetParam();
  GgufBuilder b;
  b.version(version)
      .kv_u8("t.u8", 200)
      .kv_i8("t.i8", -100)
      .kv_u16("t.u16", 60000)
      .kv_i16("t.i16", -30000)
      .kv_u32("t.u32", 4000000000u)
      .kv_i32("t.i32", -2000000000)
      .kv_f32("t.f32", 1.5f)
      .kv_bool("t.bool", true)
      .kv_string("t.string", "h\xc3\xa9llo")
      .kv_string("t.empty_string", "")
      .kv_u64("t.u64", 0xFFFFFFFFFFFFFFFFull)
      .kv_i64("t.i64", std::numeric_limits<int64_t>::min())
      .kv_f64("t.f64", 0.1)
      .kv_array<uint8_t>("a.u8", VT::U8, {1, 2, 255})
      .kv_array<int8_t>("a.i8", VT::I8, {-1, 2})
      .kv_array<uint16_t>("a.u16", VT::U16, {65535})
      .kv_array<int16_t>("a.i16", VT::I16, {-32768, 7})
      .kv_array<uint32_t>("a.u32", VT::U32, {1, 4294967295u})
      .kv_array<int32_t>("a.i32", VT::I32, {-5, 6, 7})
      .kv_array<float>("a.f32", VT::F32, {0.25f, -2.0f})
      .kv_array<uint8_t>("a.bool", VT::BOOL, {0, 1})
      .kv_array<uint64_t>("a.u64", VT::U64, {42, 0xFFFFFFFFFFFFFFFFull})
      .kv_array<int64_t>("a.i64", VT::I64, {-42})
      .kv_array<double>("a.f64", VT::F64, {1e300})
      .kv_array<uint8_t>("a.empty", VT::U8, {})
      .kv_string_array("a.string", {"x", "", "yz"})
      .alignment(64);
  b.tensor("w.q4_0", kQ4_0, {64, 3, 2});
  b.tensor("w.f32", kF32, {5});
  b.tensor("w.q2_0", kQ2_0, {128, 2});
  b.tensor("w.bf16", static_cast<uint32_t>(GgmlType::BF16), {7, 1, 1, 3});
  const auto image = b.build();
  const GgufFile f = parse(image);

  EXPECT_EQ(f.version(), version);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.path(), "test.gguf");
  EXPECT_EQ(f.n_shards(), 1u);
  ASSERT_EQ(f.metadata().size(), 27u);
  EXPECT_EQ(f.metadata()[0].key, "t.u8");  // file order is kept
  EXPECT_EQ(f.metadata()[26].key, "general.alignment");

  EXPECT_EQ(f.find("t.u8")->type, VT::U8);
  EXPECT_EQ(std::get<uint64_t>(f.find("t.u8")->v), 200u);
  EXPECT_EQ(std::get<int64_t>(f.find("t.i8")->v), -100);
  EXPECT_EQ(std::get<uint64_t>(f.find("t.u16")->v), 60000u);
  EXPECT_EQ(std::get<int64_t>(f.find("t.i16")->v), -30000);
  EXPECT_EQ(std::get<uint64_t>(f.find("t.u32")->v), 4000000000u);
  EXPECT_EQ(std::get<int64_t>(f.find("t.i32")->v), -2000000000);
  EXPECT_EQ(std::get<double>(f.find("t.f32")->v), 1.5);
  EXPECT_EQ(f.find("t.f32")->type, VT::F32);
  EXPECT_TRUE(std::get<bool>(f.find("t.bool")->v));
  EXPECT_EQ(f.require_string("t.string"), "h\xc3\xa9llo");
  EXPECT_EQ(f.require_string("t.empty_string"), "");
  EXPECT_EQ(f.require_uint("t.u64"), 0xFFFFFFFFFFFFFFFFull);
  EXPECT_EQ(std::get<int64_t>(f.find("t.i64")->v), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f.require_float("t.f64"), 0.1);
  EXPECT_EQ(f.find("nope"), nullptr);

  const ArrayValue& u8 = f.require_array("a.u8");
  EXPECT_EQ(u8.elem_type, VT::U8);
  ASSERT_EQ(u8.count, 3u);
  EXPECT_EQ(u8.int_at(2), 255);
  EXPECT_EQ(f.require_array("a.i8").int_at(0), -1);
  EXPECT_EQ(f.require_array("a.u16").int_at(0), 65535);
  EXPECT_EQ(f.require_array("a.i16").int_at(0), -32768);
  EXPECT_EQ(f.require_array("a.u32").int_at(1), 4294967295);
  EXPECT_EQ(f.require_array("a.i32").int_at(0), -5);
  EXPECT_EQ(f.require_array("a.i32").float_at(2), 7.0);
  EXPECT_EQ(f.require_array("a.f32").float_at(0), 0.25);
  EXPECT_EQ(f.require_array("a.f32").float_at(1), -2.0);
  EXPECT_EQ(f.require_array("a.bool").int_at(1), 1);
  EXPECT_EQ(f.require_array("a.u64").int_at(0), 42);
  EXPECT_THROW(f.require_array("a.u64").int_at(1), moe::Error);  // does not fit int64
  EXPECT_EQ(f.require_array("a.u64").float_at(1), 18446744073709551615.0);
  EXPECT_EQ(f.require_array("a.i64").int_at(0), -42);
  EXPECT_EQ(f.require_array("a.f64").float_at(0), 1e300);
  EXPECT_EQ(f.require_array("a.empty").count, 0u);
  const ArrayValue& s = f.require_array("a.string");
  EXPECT_EQ(s.elem_type, VT::STRING);
  ASSERT_EQ(s.count, 3u);
  EXPECT_EQ(s.string_at(0), "x");
  EXPECT_EQ(s.string_at(1), "");
  EXPECT_EQ(s.string_at(2), "yz");

  // Tensors: info order kept, exact sizes, offsets padded to 64, data pointing at the right bytes.
  ASSERT_EQ(f.tensors().size(), 4u);
  const uint64_t expected_bytes[] = {2 * 18 * 3 * 2, 5 * 4, 2 * 18 * 2, 7 * 2 * 3};
  uint64_t offset = 0;
  const uint8_t* data_start = f.tensors()[0].data;
  EXPECT_EQ((data_start - image.data()) % 64, 0);
  for (size_t i = 0; i < 4; ++i) {
    const TensorInfo& t = f.tensors()[i];
    EXPECT_EQ(t.n_bytes, expected_bytes[i]) << t.name;
    EXPECT_EQ(t.offset, offset) << t.name;
    EXPECT_EQ(t.data, data_start + offset);
    EXPECT_EQ(t.shard, 0u);
    for (uint64_t k = 0; k < t.n_bytes; ++k) {
      ASSERT_EQ(t.data[k], GgufBuilder::data_byte(i, k)) << t.name << " byte " << k;
    }
    offset += (t.n_bytes + 63) / 64 * 64;
  }
  const TensorInfo* q = f.find_tensor("w.q4_0");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type(), GgmlType::Q4_0);
  EXPECT_EQ(q->n_dims, 3u);
  EXPECT_EQ(q->ne[0], 64);
  EXPECT_EQ(q->ne[1], 3);
  EXPECT_EQ(q->ne[2], 2);
  EXPECT_EQ(q->ne[3], 1);
  EXPECT_EQ(q->n_elements(), 384);
  EXPECT_EQ(f.find_tensor("w.bf16")->n_elements(), 21);
  EXPECT_EQ(f.find_tensor("missing"), nullptr);
}

INSTANTIATE_TEST_SUITE_P(Versions, RoundTrip, ::testing::Values(2u, 3u));

TEST(GgufReader, AlignmentOneAndLargeAlignment) {
  for (uint32_t align : {1u, 8u, 4096u, 1u << 20}) {
    GgufBuilder b;
    b.alignment(align);
    b.tensor("a", kF32, {3});
    b.tensor("b", kF32, {5});
    const auto image = b.build();
    const GgufFile f = parse(image);
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ((f.tensors()[0].data - image.data()) % align, 0);
    EXPECT_EQ(f.tensors()[1].offset, (12 + align - 1) / align * align);
  }
}

TEST(GgufReader, DefaultAlignmentIs32AndNoTensorsNeedsNoDataSection) {
  GgufBuilder b;
  b.kv_string("general.architecture", "x");
  const auto image = b.build();
  const GgufFile f = parse(image);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_TRUE(f.tensors().empty());

  // Completely empty header (0 tensors, 0 keys) is a valid file.
  EXPECT_NO_THROW(parses(GgufBuilder().build()));
}

TEST(GgufReader, LastTensorMayBeFollowedByPaddingOrTrailingBytes) {
  auto b = base();
  b.tail_bytes(100);
  EXPECT_NO_THROW(parses(b.build()));
}

TEST(GgufReader, TensorNameOf63BytesIsAccepted) {
  GgufBuilder b;
  b.tensor(std::string(63, 'n'), kF32, {1});
  const auto image = b.build();
  EXPECT_EQ(parse(image).tensors()[0].name.size(), 63u);
}

TEST(GgufReader, TypedGetters) {
  GgufBuilder b;
  b.kv_u8("u8", 7)
      .kv_u16("u16", 1000)
      .kv_i32("i32", 12)
      .kv_i32("neg", -1)
      .kv_i64("i64", 1ll << 40)
      .kv_f32("f32", 0.5f)
      .kv_bool("flag", false)
      .kv_string("name", "qwen3moe")
      .kv_array<int32_t>("arr", VT::I32, {1});
  const auto image = b.build();
  const GgufFile f = parse(image);

  EXPECT_EQ(f.require_uint("u8"), 7u);
  EXPECT_EQ(f.require_uint("u16"), 1000u);
  EXPECT_EQ(f.require_uint("i32"), 12u);  // signed writers are accepted when non-negative
  EXPECT_EQ(f.require_uint("i64"), 1ull << 40);
  EXPECT_EQ(f.require_float("f32"), 0.5);
  EXPECT_EQ(f.require_float("u16"), 1000.0);  // integers convert to float
  EXPECT_EQ(f.require_float("neg"), -1.0);
  EXPECT_FALSE(f.require_bool("flag"));
  EXPECT_EQ(f.require_string("name"), "qwen3moe");
  EXPECT_EQ(f.require_array("arr").count, 1u);

  auto message = [](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const moe::Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_EQ(message([&] { f.require_uint("neg"); }),
            "GGUF 'test.gguf': key 'neg' = -1 is negative");
  EXPECT_EQ(message([&] { f.require_uint("name"); }),
            "GGUF 'test.gguf': key 'name' has type string, expected an unsigned integer");
  EXPECT_EQ(message([&] { f.require_string("u8"); }),
            "GGUF 'test.gguf': key 'u8' has type u8, expected string");
  EXPECT_EQ(message([&] { f.require_uint("missing.key"); }),
            "GGUF 'test.gguf': key 'missing.key' is missing");
  EXPECT_NE(message([&] { f.require_float("name"); }).find("key 'name' has type string"),
            std::string::npos);
  EXPECT_NE(message([&] { f.require_bool("u8"); }).find("has type u8, expected bool"),
            std::string::npos);
  EXPECT_NE(message([&] { f.require_array("u8"); }).find("expected array"), std::string::npos);
  EXPECT_NE(message([&] { f.require_string("arr"); }).find("has type array of i32"),
            std::string::npos);

  // get_* fall back only for absent keys; a present key of the wrong type is still an error.
  EXPECT_EQ(f.get_uint("missing", 9), 9u);
  EXPECT_EQ(f.get_uint("u8", 9), 7u);
  EXPECT_EQ(f.get_float("missing", 2.5), 2.5);
  EXPECT_EQ(f.get_string("missing", "dflt"), "dflt");
  EXPECT_EQ(f.get_string("name", "dflt"), "qwen3moe");
  EXPECT_TRUE(f.get_bool("missing", true));
  EXPECT_FALSE(f.get_bool("flag", true));
  EXPECT_THROW(f.get_uint("name", 0), moe::Error);
  EXPECT_THROW(f.get_bool("u8", false), moe::Error);
}

TEST(GgufReader, ArrayAccessorsCheckTypeAndIndex) {
  GgufBuilder b;
  b.kv_array<int32_t>("ints", VT::I32, {1, 2}).kv_string_array("strs", {"a"});
  const auto image = b.build();
  const GgufFile f = parse(image);
  const ArrayValue& ints = f.require_array("ints");
  const ArrayValue& strs = f.require_array("strs");
  EXPECT_THROW(ints.int_at(2), moe::Error);
  EXPECT_THROW(ints.float_at(2), moe::Error);
  EXPECT_THROW(ints.string_at(0), moe::Error);
  EXPECT_THROW(strs.int_at(0), moe::Error);
  EXPECT_THROW(strs.float_at(0), moe::Error);
  EXPECT_THROW(strs.string_at(1), moe::Error);
  EXPECT_EQ(strs.string_at(0), "a");
}

TEST(GgufReader, ValueTypeNames) {
  EXPECT_EQ(value_type_name(VT::U8), "u8");
  EXPECT_EQ(value_type_name(VT::STRING), "string");
  EXPECT_EQ(value_type_name(VT::ARRAY), "array");
  EXPECT_EQ(value_type_name(VT::F64), "f64");
  EXPECT_EQ(value_type_name(static_cast<VT>(99)), "unknown");
}

TEST(GgufReader, TokenizerKeysWithinRangeAreAccepted) {
  auto b = base();
  b.kv_array<float>("tokenizer.ggml.scores", VT::F32, {0, 0, 0, 0, 0})
      .kv_u32("tokenizer.ggml.eos_token_id", 3)
      .kv_i32("tokenizer.ggml.padding_token_id", 0)
      .kv_string_array("tokenizer.ggml.merges", {"a b"});
  EXPECT_NO_THROW(parses(b.build()));
}

// ---------------------------------------------------------------------------------------------
// Files on disk: mapping errors and split models

class GgufFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("gguf_reader_test_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::string& name, const std::vector<uint8_t>& bytes) {
    const auto p = dir_ / name;
    std::ofstream f(p, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
    return p.string();
  }

  static std::string open_error(const std::string& path) {
    try {
      GgufFile::open(path);
    } catch (const moe::Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "open succeeded: " << path;
    return {};
  }

  // Shard k (0-based) of n with one tensor named `tensor`.
  static std::vector<uint8_t> shard(uint16_t k, uint16_t n, const std::string& tensor,
                                    int32_t total = 3) {
    GgufBuilder b;
    if (k == 0) b.kv_string("general.architecture", "qwen3moe");
    b.kv_u16("split.no", k).kv_u16("split.count", n).kv_i32("split.tensors.count", total);
    b.tensor(tensor, kF32, {4 + k});
    return b.build();
  }

  std::filesystem::path dir_;
};

TEST_F(GgufFiles, OpensFileFromDisk) {
  const auto path = write("m.gguf", base().build());
  GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.require_string("general.architecture"), "qwen3moe");
  const TensorInfo* t = f.find_tensor("output_norm.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->data[5], GgufBuilder::data_byte(1, 5));
  GgufFile moved = std::move(f);
  EXPECT_EQ(moved.find_tensor("output_norm.weight")->data[5], GgufBuilder::data_byte(1, 5));
}

TEST_F(GgufFiles, MissingEmptyAndDirectory) {
  const std::string missing = (dir_ / "missing.gguf").string();
  EXPECT_EQ(open_error(missing), "cannot open '" + missing + "': No such file or directory");
  const auto empty = write("empty.gguf", {});
  EXPECT_NE(open_error(empty).find("GGUF '" + empty + "': truncated while reading header magic"),
            std::string::npos);
  EXPECT_NE(open_error(dir_.string()).find("not a regular file"), std::string::npos);
}

TEST_F(GgufFiles, SplitModelOpensAllShards) {
  write("m-00001-of-00003.gguf", shard(0, 3, "a"));
  write("m-00002-of-00003.gguf", shard(1, 3, "b"));
  write("m-00003-of-00003.gguf", shard(2, 3, "c"));
  for (const char* first : {"m-00001-of-00003.gguf", "m-00003-of-00003.gguf"}) {
    const GgufFile f = GgufFile::open((dir_ / first).string());
    EXPECT_EQ(f.n_shards(), 3u);
    EXPECT_EQ(f.require_string("general.architecture"), "qwen3moe");  // from the first shard
    ASSERT_EQ(f.tensors().size(), 3u);
    for (uint32_t k = 0; k < 3; ++k) {
      const TensorInfo& t = f.tensors()[k];
      EXPECT_EQ(t.name, std::string(1, static_cast<char>('a' + k)));
      EXPECT_EQ(t.shard, k);
      EXPECT_EQ(t.ne[0], 4 + k);
      EXPECT_EQ(t.data[3], GgufBuilder::data_byte(0, 3));
      EXPECT_EQ(f.find_tensor(t.name), &t);
    }
  }
}

TEST_F(GgufFiles, SplitModelErrors) {
  write("m-00001-of-00003.gguf", shard(0, 3, "a"));
  write("m-00002-of-00003.gguf", shard(1, 3, "b"));
  const std::string first = (dir_ / "m-00001-of-00003.gguf").string();
  const std::string third = (dir_ / "m-00003-of-00003.gguf").string();
  EXPECT_EQ(open_error(first), "cannot open '" + third + "': No such file or directory");

  write("m-00003-of-00003.gguf", shard(2, 3, "a"));
  EXPECT_NE(open_error(first).find("duplicate tensor name 'a' (in shards 1 and 3)"),
            std::string::npos);

  write("m-00003-of-00003.gguf", shard(2, 4, "c"));
  EXPECT_NE(open_error(first).find("split.count = 4 but the file name says 3 shards"),
            std::string::npos);

  write("m-00003-of-00003.gguf", shard(1, 3, "c"));
  EXPECT_NE(open_error(first).find("split.no = 1 but the file name says shard 2"),
            std::string::npos);

  write("m-00003-of-00003.gguf", shard(2, 3, "c", 3));
  write("m-00001-of-00003.gguf", shard(0, 3, "a", 5));
  EXPECT_NE(open_error(first).find("split.tensors.count = 5 but the files hold 3 tensors"),
            std::string::npos);

  // A shard opened under a plain name would silently miss tensors.
  const auto plain = write("renamed.gguf", shard(0, 3, "a"));
  EXPECT_NE(open_error(plain).find("split.count = 3: this is one shard of a split model"),
            std::string::npos);

  // A shard with its tensor data cut off names its own path.
  auto cut = shard(1, 3, "b");
  cut.resize(cut.size() - 1);
  const auto second = write("m-00002-of-00003.gguf", cut);
  EXPECT_NE(open_error(first).find("GGUF '" + second + "': tensor 'b'"), std::string::npos);
}

}  // namespace
}  // namespace moe::gguf
