// GGUF reader on corrupt input: every truncated prefix and byte mutation, and a table of corrupt
// files (each must be rejected with moe::Error and a message naming the problem).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
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
using reader_test::kI8;
using reader_test::kQ2_0;
using reader_test::kQ4_0;
using reader_test::parse;
using VT = ValueType;

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

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();
constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();

// The table is built from groups of cases, one per part of the file they corrupt.

// Header: magic, version, counts.
std::vector<CorruptCase> header_cases() {
  return {
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
  };
}

// Metadata: key and value encodings, then general.alignment.
std::vector<CorruptCase> metadata_cases() {
  const uint32_t string_t = static_cast<uint32_t>(VT::STRING);
  const uint32_t array_t = static_cast<uint32_t>(VT::ARRAY);
  return {
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
  };
}

// Tensor infos: names, n_dims and dimensions.
std::vector<CorruptCase> tensor_shape_cases() {
  return {
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
  };
}

// Tensor infos: byte sizes, ggml types and block sizes.
std::vector<CorruptCase> tensor_size_and_type_cases() {
  return {
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
  };
}

// Data section: offsets and the dense layout.
std::vector<CorruptCase> data_section_cases() {
  return {
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
  };
}

// Tokenizer consistency.
std::vector<CorruptCase> tokenizer_cases() {
  return {
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

// Every group, in order (the order gtest lists the cases in).
std::vector<CorruptCase> corrupt_cases() {
  std::vector<CorruptCase> all;
  for (const auto& group : {header_cases, metadata_cases, tensor_shape_cases,
                            tensor_size_and_type_cases, data_section_cases, tokenizer_cases}) {
    for (CorruptCase& c : group()) all.push_back(std::move(c));
  }
  return all;
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

}  // namespace
}  // namespace moe::gguf
