// GGUF reader: round trips through the in-memory builder, accessors, split files, and a table of
// corrupt files (each must be rejected with moe::Error and a message naming the problem).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "tests/gguf_builder.h"

namespace moe::gguf {
namespace {

using moe::test::GgufBuilder;
using VT = ValueType;

constexpr uint32_t kF32 = static_cast<uint32_t>(GgmlType::F32);
constexpr uint32_t kI8 = static_cast<uint32_t>(GgmlType::I8);
constexpr uint32_t kQ4_0 = static_cast<uint32_t>(GgmlType::Q4_0);
constexpr uint32_t kQ2_0 = static_cast<uint32_t>(GgmlType::Q2_0);

GgufFile parse(const std::vector<uint8_t>& bytes) { return GgufFile::parse(bytes, "test.gguf"); }
GgufFile parse(std::vector<uint8_t>&& bytes) = delete;  // the result would point into a temporary
void parses(const std::vector<uint8_t>& bytes) { (void)parse(bytes); }

// Message of the moe::Error that parsing throws; fails the test if nothing (or something else) is
// thrown.
std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    parse(bytes);
  } catch (const moe::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parse succeeded, expected moe::Error";
  return {};
}

// A small valid model: metadata with a tokenizer, and two tensors of different types.
GgufBuilder base() {
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

template <typename T>
void patch(std::vector<uint8_t>& b, size_t offset, T v) {
  ASSERT_LE(offset + sizeof(T), b.size());
  std::memcpy(b.data() + offset, &v, sizeof(T));
}

std::vector<uint8_t> u64_payload(uint64_t v) {
  std::vector<uint8_t> p;
  GgufBuilder::put<uint64_t>(p, v);
  return p;
}

// Array header (element type, count) followed by `extra` zero bytes.
std::vector<uint8_t> array_payload(uint32_t elem, uint64_t count, size_t extra = 0) {
  std::vector<uint8_t> p;
  GgufBuilder::put<uint32_t>(p, elem);
  GgufBuilder::put<uint64_t>(p, count);
  p.resize(p.size() + extra, 0);
  return p;
}

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
// Truncation and mutation: every prefix must be rejected, no mutation may crash.

TEST(GgufCorrupt, EveryTruncatedPrefixIsRejected) {
  const auto full = base().build();
  ASSERT_NO_THROW(parse(full));
  for (size_t len = 0; len < full.size(); ++len) {
    // A buffer of exactly `len` bytes, so that AddressSanitizer sees any read past its end.
    const std::vector<uint8_t> prefix(full.begin(), full.begin() + static_cast<ptrdiff_t>(len));
    try {
      parse(prefix);
      ADD_FAILURE() << "prefix of " << len << " bytes parsed";
    } catch (const moe::Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("GGUF 'test.gguf': ", 0), 0u) << e.what();
    }
  }
}

TEST(GgufCorrupt, TruncationMessageNamesFieldAndOffset) {
  const auto full = base().build();
  // Cut inside the second tensor's dims: find the name, skip it and n_dims.
  const std::string name = "output_norm.weight";
  const auto it = std::search(full.begin(), full.end(), name.begin(), name.end());
  ASSERT_NE(it, full.end());
  const size_t dims_at = static_cast<size_t>(it - full.begin()) + name.size() + 4;
  const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<ptrdiff_t>(dims_at) + 3);
  EXPECT_EQ(parse_error(cut),
            "GGUF 'test.gguf': truncated while reading tensor 1 "
            "('output_norm.weight') dims at offset " +
                std::to_string(dims_at) + " (needs 8 bytes, 3 left)");
}

TEST(GgufCorrupt, EveryByteMutationParsesOrThrowsMoeError) {
  const auto full = base().build();
  for (size_t pos = 0; pos < full.size(); ++pos) {
    for (uint8_t x : {0x01, 0x80, 0xff}) {
      auto m = full;
      m[pos] ^= x;
      try {
        const GgufFile f = parse(m);
        for (const TensorInfo& t : f.tensors()) {
          // Touch both ends so AddressSanitizer checks the bounds of every accepted tensor.
          volatile uint8_t sink = t.data[0];
          sink = t.data[t.n_bytes - 1];
          (void)sink;
        }
      } catch (const moe::Error&) {
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Table of corrupt files

struct CorruptCase {
  const char* name;
  std::function<std::vector<uint8_t>()> make;
  std::string expect;  // substring of the error message
};

std::vector<CorruptCase> corrupt_cases() {
  constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
  constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
  const uint32_t string_t = static_cast<uint32_t>(VT::STRING);
  const uint32_t array_t = static_cast<uint32_t>(VT::ARRAY);
  return {
      // --- header ---
      {"BadMagic", [] { return base().magic(0x46554746).build(); }, "bad magic 46 47 55 46"},
      {"Empty", [] { return std::vector<uint8_t>{}; }, "truncated while reading header magic"},
      {"Version0", [] { return base().version(0).build(); }, "unsupported GGUF version 0"},
      {"Version1", [] { return base().version(1).build(); }, "unsupported GGUF version 1"},
      {"Version4", [] { return base().version(4).build(); }, "unsupported GGUF version 4"},
      {"VersionBigEndian", [] { return base().version(0x03000000).build(); }, "big-endian"},
      {"HugeNKv", [] { return base().n_kv_override(1ull << 40).build(); },
       "1099511627776 key-value pairs, more than the limit"},
      {"NKvMaxUint64", [] { return base().n_kv_override(kU64Max).build(); }, "more than the limit"},
      {"NKvBeyondFileSize", [] { return base().n_kv_override(kMaxKeyValues).build(); },
       "which need at least"},
      {"HugeNTensors", [] { return base().n_tensors_override(kU64Max).build(); },
       "18446744073709551615 tensors, more than the limit"},
      {"NTensorsBeyondFileSize", [] { return base().n_tensors_override(1000).build(); },
       "which need at least"},

      // --- metadata ---
      {"HugeKeyLength",
       [] {
         auto img = base().build();
         patch<uint64_t>(img, 24, 1ull << 40);  // first key's length, right after the header
         return img;
       },
       "key-value 0 key at offset 24: string length 1099511627776 exceeds the limit"},
      {"KeyLengthBeyondFile",
       [] {
         auto img = base().build();
         patch<uint64_t>(img, 24, 1u << 20);
         return img;
       },
       "truncated while reading key-value 0 key"},
      {"HugeStringValue",
       [] { return base().kv_raw("general.name", string_t, u64_payload(kU64Max)).build(); },
       "('general.name') value at offset"},
      {"StringValueBeyondFile",
       [] { return base().kv_raw("general.name", string_t, u64_payload(60000)).build(); },
       "truncated while reading key-value 5 ('general.name') value"},
      {"HugeArrayCount",
       [] { return base().kv_raw("x.arr", array_t, array_payload(4, 1ull << 40)).build(); },
       "array of 1099511627776 elements exceeds the limit"},
      {"ArrayCountBeyondFile",
       [] { return base().kv_raw("x.arr", array_t, array_payload(4, kMaxArrayElements)).build(); },
       "truncated: key-value 5 ('x.arr') value declares 67108864 u32 elements"},
      {"StringArrayCountBeyondFile",
       [] { return base().kv_raw("x.arr", array_t, array_payload(string_t, 1u << 20)).build(); },
       "declares 1048576 strings"},
      {"StringArrayElementTooLong",
       [] {
         auto p = array_payload(string_t, 2);
         GgufBuilder::put_string(p, "ok");
         GgufBuilder::put<uint64_t>(p, 1000000);
         return base().kv_raw("x.arr", array_t, p).build();
       },
       "truncated while reading key-value 5 ('x.arr') array element 1"},
      {"ArrayOfArrays",
       [] { return base().kv_raw("x.arr", array_t, array_payload(array_t, 1, 12)).build(); },
       "arrays of arrays are not supported"},
      {"UnknownValueType",
       [] {
         return base().kv_raw("x.v", 13, {0, 0, 0, 0}).build();
       },
       "unknown value type id 13"},
      {"UnknownValueTypeHuge", [] { return base().kv_raw("x.v", 0xFFFFFFFF, {0}).build(); },
       "unknown value type id 4294967295"},
      {"UnknownArrayElementType",
       [] { return base().kv_raw("x.arr", array_t, array_payload(13, 1, 8)).build(); },
       "unknown array element type id 13"},
      {"DuplicateKey", [] { return base().kv_u32("qwen3moe.block_count", 5).build(); },
       "duplicate key 'qwen3moe.block_count'"},
      {"EmptyKey", [] { return base().kv_u32("", 1).build(); }, "key-value 5 has an empty key"},

      // --- alignment ---
      {"AlignmentZero", [] { return base().kv_u32("general.alignment", 0).build(); },
       "general.alignment = 0 is invalid"},
      {"AlignmentNotPowerOfTwo", [] { return base().kv_u32("general.alignment", 3).build(); },
       "general.alignment = 3 is invalid"},
      {"AlignmentHuge", [] { return base().kv_u32("general.alignment", 1u << 21).build(); },
       "general.alignment = 2097152 is invalid"},
      {"AlignmentTop", [] { return base().kv_u32("general.alignment", 1u << 31).build(); },
       "general.alignment = 2147483648 is invalid"},
      {"AlignmentNotU32", [] { return base().kv_u64("general.alignment", 32).build(); },
       "general.alignment must have type u32, found u64"},
      {"AlignmentAsString", [] { return base().kv_string("general.alignment", "32").build(); },
       "general.alignment must have type u32, found string"},
      {"LaidOutWithOtherAlignment",
       [] {
         auto b = base().kv_u32("general.alignment", 64);
         b.layout_alignment(32);
         return b.build();
       },
       "data offset 96 is not a multiple of the alignment 64"},

      // --- tensor infos ---
      {"EmptyTensorName",
       [] {
         auto b = base();
         b.tensor("", kF32, {4});
         return b.build();
       },
       "tensor 2 has an empty name"},
      {"TensorNameTooLong",
       [] {
         auto b = base();
         b.tensor(std::string(64, 'n'), kF32, {4});
         return b.build();
       },
       "is 64 bytes long, more than the limit of 63"},
      {"DuplicateTensorName",
       [] {
         auto b = base();
         b.tensor("token_embd.weight", kF32, {4});
         return b.build();
       },
       "duplicate tensor name 'token_embd.weight' (tensor 2)"},
      {"NDims0",
       [] {
         auto b = base();
         b.tensor("t", kF32, {});
         return b.build();
       },
       "tensor 2 ('t') n_dims = 0 (must be 1..4)"},
      {"NDims5",
       [] {
         auto b = base();
         b.tensor("t", kF32, {1, 1, 1, 1, 1});
         return b.build();
       },
       "tensor 2 ('t') n_dims = 5 (must be 1..4)"},
      {"NDimsHuge",
       [] {
         auto b = base();
         b.tensor("t", kF32, {1}).n_dims = 0xFFFFFFFF;
         return b.build();
       },
       "n_dims = 4294967295"},
      {"ZeroDim",
       [] {
         auto b = base();
         b.tensor("t", kF32, {4, 0});
         return b.build();
       },
       "ne[1] = 0 (every dimension must be at least 1)"},
      {"NegativeDim",
       [] {
         auto b = base();
         b.tensor("t", kF32, {-5});
         return b.build();
       },
       "ne[0] = -5"},
      {"DimsInt64MaxTimes2",  // llama.cpp issue #27203: the product wraps negative
       [] {
         auto b = base();
         b.tensor("t", kI8, {kI64Max, 2});
         return b.build();
       },
       "element count overflows at ne[1]"},
      {"DimsProductWrapsToZero",  // 2^64 wraps to 0 if only checked at the end
       [] {
         auto b = base();
         b.tensor("t", kI8, {1ll << 32, 1ll << 32, 1ll << 32, 1ll << 32});
         return b.build();
       },
       "element count overflows at ne[1]"},
      {"DimsProductOverflowAtThirdDim",
       [] {
         auto b = base();
         b.tensor("t", kI8, {1ll << 31, 1ll << 31, 4, 1});
         return b.build();
       },
       "element count overflows at ne[2]"},
      {"RowsTwoPow42Plus1",  // PR #18674: elements fit int64, bytes wrap past 2^64
       [] {
         auto b = base();
         b.tensor("t", kF32, {1ll << 20, (1ll << 42) + 1});
         return b.build();
       },
       "byte size overflows"},
      {"GgmlPadWrap",  // PR #24759: n_bytes = 2^64-4 passes, padding it to 32 wraps
       [] {
         GgufBuilder b;
         b.tensor("t", kF32, {(1ll << 62) - 1}).data_bytes = 0;
         return b.build();
       },
       "byte size 18446744073709551612 overflows when padded"},
      {"HugeTensorBeyondFile",
       [] {
         GgufBuilder b;
         b.tensor("t", kF32, {1ll << 61}).data_bytes = 0;
         return b.build();
       },
       "needs 9223372036854775808 bytes but only 0 bytes remain"},
      {"UnknownGgmlType",
       [] {
         auto b = base();
         b.tensor("t", 77, {32});
         return b.build();
       },
       "tensor 2 ('t') has unknown ggml type unknown (id 77)"},
      {"RemovedGgmlType",  // Q4_2 (id 4) was removed from ggml
       [] {
         auto b = base();
         b.tensor("t", 4, {32});
         return b.build();
       },
       "(id 4)"},
      {"HugeGgmlType",
       [] {
         auto b = base();
         b.tensor("t", 0xFFFFFFFF, {32});
         return b.build();
       },
       "(id 4294967295)"},
      {"Ne0NotMultipleOfBlock",
       [] {
         auto b = base();
         b.tensor("t", kQ4_0, {48, 2});
         return b.build();
       },
       "tensor 't' (type q4_0 (id 2), shape 48x2): ne[0] = 48 is not a multiple of the block "
       "size 32"},

      // --- data section ---
      {"MisalignedOffset",
       [] {
         auto b = base();
         b.tensors()[1].offset = 65;
         return b.tail_bytes(64).build();
       },
       "data offset 65 is not a multiple of the alignment 32"},
      {"OffsetBeyondFile",
       [] {
         auto b = base();
         b.tensors()[1].offset = 1ull << 40;
         return b.build();
       },
       "data offset 1099511627776 is beyond the end of the file"},
      {"OffsetNearUint64MaxWraps",
       [] {
         auto b = base();
         b.tensors()[1].offset = kU64Max - 31;  // aligned; offset + size wraps around
         return b.build();
       },
       "is beyond the end of the file"},
      {"DataSectionMissing",
       [] {
         GgufBuilder b;
         b.kv_string("general.name", "xyz");
         b.tensor("t", kF32, {4});               // infos end at 92, data would start at 96
         return b.truncate_end(16 + 4).build();  // 92 bytes: infos intact, no data section
       },
       "data section would start at offset 96, past the end of the file (92 bytes)"},
      {"TruncatedData", [] { return base().truncate_end(1).build(); },
       "tensor 'output_norm.weight' (type f32 (id 0), shape 8) needs 32 bytes but only 31 bytes "
       "remain"},
      {"TensorsAtSameOffset",
       [] {
         auto b = base();
         b.tensors()[1].offset = 0;
         return b.build();
       },
       "overlapping it"},
      {"PartialOverlap",
       [] {
         GgufBuilder b;
         b.tensor("a", kF32, {16});  // 64 bytes at 0
         b.tensor("b", kF32, {8}).offset = 32;
         return b.tail_bytes(64).build();
       },
       "tensor 'a' (type f32 (id 0), shape 16) needs 64 bytes but occupies 32 bytes in the file"},
      {"GapBetweenTensors",
       [] {
         auto b = base();
         b.tensors()[1].offset = 64;  // token_embd needs 72 bytes (96 padded)
         return b.tail_bytes(128).build();
       },
       "needs 72 bytes but occupies 64 bytes"},
      {"ExtraSpaceBetweenTensors",
       [] {
         auto b = base();
         b.tensors()[1].offset = 128;
         return b.tail_bytes(128).build();
       },
       "needs 72 bytes but occupies 128 bytes"},
      {"Q2_0WithBlocksOf128",  // same id, other block layout: must not be misread
       [] {
         GgufBuilder b;
         b.tensor("blk.0.ffn_down_exps.weight", kQ2_0, {256, 256, 16}).data_bytes =
             256 * 256 * 16 / 128 * 18;
         b.tensor("blk.0.ffn_norm.weight", kF32, {256});
         return b.build();
       },
       "tensor 'blk.0.ffn_down_exps.weight' (type q2_0 (id 42), shape 256x256x16) needs 294912 "
       "bytes but occupies 147456 bytes in the file: not the layout this runtime knows for q2_0"},
      {"Q2_0WithBlocksOf128AsLastTensor",
       [] {
         GgufBuilder b;
         b.tensor("blk.0.ffn_norm.weight", kF32, {256});
         b.tensor("blk.0.ffn_down_exps.weight", kQ2_0, {256, 256, 16}).data_bytes =
             256 * 256 * 16 / 128 * 18;
         return b.build();
       },
       "needs 294912 bytes but only 147456 bytes remain in the file after its data offset 1024: "
       "truncated file, or not the layout this runtime knows for q2_0"},

      // --- tokenizer consistency ---
      {"TokenTypeDeclaredF32",
       [] {
         GgufBuilder b;
         b.kv_string_array("tokenizer.ggml.tokens", {"a", "b"})
             .kv_array<float>("tokenizer.ggml.token_type", VT::F32, {1, 1});
         return b.build();
       },
       "tokenizer.ggml.token_type must be an array of i32, found an array of f32"},
      {"TokenTypeDeclaredU8",  // PR #26690: read as int32 it over-reads 3x
       [] {
         GgufBuilder b;
         b.kv_string_array("tokenizer.ggml.tokens", {"a", "b"})
             .kv_array<uint8_t>("tokenizer.ggml.token_type", VT::U8, {1, 1});
         return b.build();
       },
       "tokenizer.ggml.token_type must be an array of i32, found an array of u8"},
      {"TokenTypeNotArray",
       [] { return GgufBuilder().kv_i32("tokenizer.ggml.token_type", 1).build(); },
       "tokenizer.ggml.token_type must be an array of i32, found i32"},
      {"ScoresDeclaredI32",
       [] {
         GgufBuilder b;
         b.kv_string_array("tokenizer.ggml.tokens", {"a"})
             .kv_array<int32_t>("tokenizer.ggml.scores", VT::I32, {0});
         return b.build();
       },
       "tokenizer.ggml.scores must be an array of f32, found an array of i32"},
      {"TokenTypeShorterThanTokens",
       [] {
         GgufBuilder b;
         b.kv_string_array("tokenizer.ggml.tokens", {"a", "b", "c"})
             .kv_array<int32_t>("tokenizer.ggml.token_type", VT::I32, {1, 1});
         return b.build();
       },
       "tokenizer.ggml.token_type has 2 elements, fewer than the 3 tokens"},
      {"ScoresShorterThanTokens",
       [] {
         GgufBuilder b;
         b.kv_string_array("tokenizer.ggml.tokens", {"a", "b", "c"})
             .kv_array<float>("tokenizer.ggml.scores", VT::F32, {});
         return b.build();
       },
       "tokenizer.ggml.scores has 0 elements"},
      {"TokensNotStrings",
       [] {
         return GgufBuilder().kv_array<int32_t>("tokenizer.ggml.tokens", VT::I32, {1}).build();
       },
       "tokenizer.ggml.tokens must be an array of strings, found an array of i32"},
      {"MergesNotStrings",
       [] { return GgufBuilder().kv_string("tokenizer.ggml.merges", "a b").build(); },
       "tokenizer.ggml.merges must be an array of strings, found string"},
      {"BosOutOfRange",
       [] {
         GgufBuilder b;
         b.kv_string_array("tokenizer.ggml.tokens", {"a", "b"})
             .kv_u32("tokenizer.ggml.bos_token_id", 2);
         return b.build();
       },
       "tokenizer.ggml.bos_token_id = 2 is out of range (the vocabulary has 2 tokens)"},
      {"EosOutOfRange", [] { return base().kv_u32("tokenizer.ggml.eos_token_id", 4).build(); },
       "tokenizer.ggml.eos_token_id = 4 is out of range (the vocabulary has 4 tokens)"},
      {"BosHuge",
       [] {
         GgufBuilder b;
         b.kv_string_array("tokenizer.ggml.tokens", {"a"})
             .kv_u64("tokenizer.ggml.bos_token_id", kU64Max);
         return b.build();
       },
       "tokenizer.ggml.bos_token_id = 18446744073709551615 is out of range"},
      {"PaddingIdNegative",
       [] { return base().kv_i32("tokenizer.ggml.padding_token_id", -1).build(); },
       "key 'tokenizer.ggml.padding_token_id' = -1 is negative"},
      {"UnknownIdNotInteger",
       [] { return base().kv_f32("tokenizer.ggml.unknown_token_id", 1.0f).build(); },
       "key 'tokenizer.ggml.unknown_token_id' has type f32"},
  };
}

// Names the case in gtest output instead of dumping its bytes.
void PrintTo(const CorruptCase& c, std::ostream* os) { *os << c.name; }

class Corrupt : public ::testing::TestWithParam<CorruptCase> {};

TEST_P(Corrupt, IsRejectedWithMessage) {
  const CorruptCase& c = GetParam();
  const std::vector<uint8_t> bytes = c.make();
  const std::string msg = parse_error(bytes);
  EXPECT_EQ(msg.rfind("GGUF 'test.gguf': ", 0), 0u) << msg;
  EXPECT_NE(msg.find(c.expect), std::string::npos)
      << "message: " << msg << "\nexpected to contain: " << c.expect;
}

INSTANTIATE_TEST_SUITE_P(Table, Corrupt, ::testing::ValuesIn(corrupt_cases()),
                         [](const ::testing::TestParamInfo<CorruptCase>& i) {
                           return std::string(i.param.name);
                         });

// The base image must itself be valid, or the table above would prove nothing.
TEST(GgufCorrupt, BaseImageIsValid) {
  const auto image = base().build();
  const GgufFile f = parse(image);
  EXPECT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.require_uint("tokenizer.ggml.bos_token_id"), 2u);
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
