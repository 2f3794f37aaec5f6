// Vocabulary loading from hand-built GGUF images: a small valid vocabulary works, and every kind
// of corrupt tokenizer metadata is rejected with moe::Error naming the problem.
#include <gtest/gtest.h>

#include <functional>
#include <optional>

#include "common/error.h"
#include "coordinator/tokenizer/byte_level.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/gguf_builder.h"

namespace {

using moe::gguf::ValueType;
using moe::tokenizer::Tokenizer;

// 256 byte tokens, "ab", "abc", then <|endoftext|> (CONTROL), <think> (USER_DEFINED), [PAD261].
struct Spec {
  std::optional<std::string> model = "gpt2";
  std::optional<std::string> pre = "qwen2";
  std::optional<std::vector<std::string>> tokens;
  std::optional<std::vector<int32_t>> types;
  std::optional<std::vector<std::string>> merges = std::vector<std::string>{"a b", "ab c"};
  std::optional<uint32_t> bos = 258, eos = 258;

  Spec() {
    tokens.emplace();
    for (int b = 0; b < 256; ++b) {
      tokens->push_back(moe::tokenizer::byte_level_encode(std::string(1, char(b))));
    }
    tokens->insert(tokens->end(), {"ab", "abc", "<|endoftext|>", "<think>", "[PAD261]"});
    types.emplace(256, 1);
    types->insert(types->end(), {1, 1, 3, 4, 5});
  }

  std::vector<uint8_t> build() const {
    moe::test::GgufBuilder b;
    b.kv_string("general.architecture", "qwen3moe");
    if (model) b.kv_string("tokenizer.ggml.model", *model);
    if (pre) b.kv_string("tokenizer.ggml.pre", *pre);
    if (tokens) b.kv_string_array("tokenizer.ggml.tokens", *tokens);
    if (types) b.kv_array<int32_t>("tokenizer.ggml.token_type", ValueType::I32, *types);
    if (merges) b.kv_string_array("tokenizer.ggml.merges", *merges);
    if (bos) b.kv_u32("tokenizer.ggml.bos_token_id", *bos);
    if (eos) b.kv_u32("tokenizer.ggml.eos_token_id", *eos);
    b.kv_bool("tokenizer.ggml.add_bos_token", false);
    return b.build();
  }
};

Tokenizer load(const Spec& s) {
  const std::vector<uint8_t> bytes = s.build();
  const auto f = moe::gguf::GgufFile::parse(bytes);
  return Tokenizer::from_gguf(f);
}

// Expects moe::Error whose message contains `needle`.
void expect_error(const Spec& s, const std::string& needle) {
  try {
    load(s);
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const moe::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(TokenizerVocab, SmallValidVocabulary) {
  const Tokenizer t = load(Spec{});
  EXPECT_EQ(t.n_vocab(), 261);
  EXPECT_EQ(t.bos_id(), 258);
  EXPECT_EQ(t.eos_id(), 258);
  EXPECT_TRUE(t.is_eog(258));
  EXPECT_FALSE(t.is_eog(256));
  EXPECT_EQ(t.encode("abcab", false), (std::vector<int32_t>{257, 256}));
  EXPECT_EQ(t.encode("x<think>abc", false), (std::vector<int32_t>{'x', 259, 257}));
  // CONTROL text is plain text unless parse_special.
  EXPECT_EQ(t.encode("<|endoftext|>", true), (std::vector<int32_t>{258}));
  EXPECT_NE(t.encode("<|endoftext|>", false), (std::vector<int32_t>{258}));
  EXPECT_EQ(t.decode(t.encode("<|endoftext|>", false), false, true), "<|endoftext|>");
  EXPECT_EQ(t.token_piece(260, true), "");  // UNUSED
  EXPECT_THROW(t.token_piece(261, true), moe::Error);
  EXPECT_THROW(t.token_piece(-1, true), moe::Error);
  const std::vector<int32_t> bad = {256, 999};
  EXPECT_THROW(t.decode(bad, false, true), moe::Error);
}

TEST(TokenizerVocab, TokenTypesOptional) {
  Spec s;
  s.types.reset();
  const Tokenizer t = load(s);
  EXPECT_EQ(t.token_piece(259, false), "<think>");  // NORMAL when untyped
  // End-of-generation texts are always CONTROL (llama.cpp forces it), so never plain text.
  EXPECT_EQ(t.token_piece(258, false), "");
  EXPECT_EQ(t.token_piece(258, true), "<|endoftext|>");
}

TEST(TokenizerVocab, CorruptMetadata) {
  const auto with = [](const std::function<void(Spec&)>& edit) {
    Spec s;
    edit(s);
    return s;
  };
  expect_error(with([](Spec& s) { s.model.reset(); }), "tokenizer.ggml.model");
  expect_error(with([](Spec& s) { s.model = "llama"; }), "'llama'");
  expect_error(with([](Spec& s) { s.pre.reset(); }), "tokenizer.ggml.pre");
  expect_error(with([](Spec& s) { s.pre = "klingon"; }), "'klingon'");
  expect_error(with([](Spec& s) { s.tokens.reset(); }), "tokenizer.ggml.tokens");
  expect_error(with([](Spec& s) {
                 s.tokens->clear();
                 s.types.reset();
                 s.bos.reset();
                 s.eos.reset();
               }),
               "tokenizer.ggml.tokens is empty");
  expect_error(with([](Spec& s) { s.merges.reset(); }), "tokenizer.ggml.merges");
  expect_error(with([](Spec& s) { s.merges->push_back("ab"); }), "merges[2] = 'ab'");
  expect_error(with([](Spec& s) { s.merges->push_back("a  b"); }), "one space");
  expect_error(with([](Spec& s) { s.merges->push_back("a b c"); }), "one space");
  expect_error(with([](Spec& s) { s.merges->push_back(" a"); }), "one space");
  expect_error(with([](Spec& s) { s.merges->push_back("a "); }), "one space");
  expect_error(with([](Spec& s) { s.merges->push_back("a zz"); }), "'zz' is not a token");
  expect_error(with([](Spec& s) { s.merges->push_back("b c"); }), "'bc' is not a token");
  expect_error(with([](Spec& s) { s.bos = 261; }), "bos_token_id = 261 is out of range");
  expect_error(with([](Spec& s) { s.eos = 100000; }), "eos_token_id");
  expect_error(with([](Spec& s) { s.types->pop_back(); }), "token_type");
  expect_error(with([](Spec& s) { (*s.types)[7] = 9; }), "token 7 has invalid type 9");
  expect_error(with([](Spec& s) { (*s.tokens)[65] = "zz"; }), "token 'A' for byte 65");
}

}  // namespace
