// Unit tests: pre-tokenizer splits, UTF-8 handling, byte-level mapping, round trips, special ids,
// and speed on long words and large inputs.
#include <gtest/gtest.h>

#include <chrono>
#include <iostream>
#include <random>

#include "common/error.h"
#include "coordinator/tokenizer/byte_level.h"
#include "coordinator/tokenizer/pretokenize.h"
#include "coordinator/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_testing.h"

namespace {

using moe::tokenizer::pretokenize;
using moe::tokenizer::PreTokenizer;
using Pieces = std::vector<std::string>;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(TokenizerPretokenize, Qwen2Splits) {
  const auto q = [](std::string_view s) { return pretokenize(PreTokenizer::kQwen2, s); };
  EXPECT_EQ(q("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(q(""), Pieces{});
  EXPECT_EQ(q("a   b"), (Pieces{"a", "  ", " b"}));
  EXPECT_EQ(q("a  "), (Pieces{"a", "  "}));
  EXPECT_EQ(q("a\n\n  b"), (Pieces{"a", "\n\n", " ", " b"}));
  EXPECT_EQ(q("x \r\n\ty"), (Pieces{"x", " \r\n", "\ty"}));
  EXPECT_EQ(q("1234"), (Pieces{"1", "2", "3", "4"}));
  EXPECT_EQ(q(" 12"), (Pieces{" ", "1", "2"}));
  EXPECT_EQ(q("I'M don't we'LL"), (Pieces{"I", "'M", " don", "'t", " we", "'LL"}));
  EXPECT_EQ(q("'x"), (Pieces{"'x"}));
  EXPECT_EQ(q("a...\n\nb"), (Pieces{"a", "...\n\n", "b"}));
  EXPECT_EQ(q(" ?!"), (Pieces{" ?!"}));
  EXPECT_EQ(q("$x"), (Pieces{"$x"}));
  EXPECT_EQ(q("\xC2\xB2\xC2\xBD"), (Pieces{"\xC2\xB2", "\xC2\xBD"}));  // ²½ are \p{N}
  // U+3000 and U+00A0 are whitespace, U+001F is not.
  EXPECT_EQ(q("a\xE3\x80\x80\xE3\x80\x80"
              "b"),
            (Pieces{"a", "\xE3\x80\x80",
                    "\xE3\x80\x80"
                    "b"}));
  EXPECT_EQ(q("a\x1F"
              "b"),
            (Pieces{"a",
                    "\x1F"
                    "b"}));
  // A combining mark is punctuation for qwen2 ...
  EXPECT_EQ(q("e\xCC\x81t"), (Pieces{"e", "\xCC\x81t"}));
}

TEST(TokenizerPretokenize, Qwen35KeepsMarksInWords) {
  const auto q = [](std::string_view s) { return pretokenize(PreTokenizer::kQwen35, s); };
  EXPECT_EQ(q("Hello world"), (Pieces{"Hello", " world"}));
  EXPECT_EQ(q("e\xCC\x81t"), (Pieces{"e\xCC\x81t"}));
  EXPECT_EQ(q(" \xCC\x81"
              "a"),
            (Pieces{" \xCC\x81"
                    "a"}));
  EXPECT_EQ(q("\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82"),
            (Pieces{"\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82"}));
  EXPECT_EQ(pretokenize(PreTokenizer::kQwen2, "\xE0\xA4\xB9\xE0\xA4\xBF\xE0\xA4\x82"),
            (Pieces{"\xE0\xA4\xB9", "\xE0\xA4\xBF\xE0\xA4\x82"}));
}

TEST(TokenizerUtf8, InvalidInputNeverFails) {
  // Bytes that do not decode count as U+FFFD, as in llama.cpp.
  EXPECT_EQ(pretokenize(PreTokenizer::kQwen2,
                        "\xFF"
                        "A"),
            (Pieces{"\xEF\xBF\xBD"
                    "A"}));
  const auto& tok = moe::test::qwen3_tokenizer();
  EXPECT_EQ(tok.encode("x\xFFy\x80", false), tok.encode("x\xEF\xBF\xBDy\xEF\xBF\xBD", false));
  EXPECT_EQ(tok.encode("\xE2\x82", false), tok.encode("\xEF\xBF\xBD\xEF\xBF\xBD", false));
  std::mt19937 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string s(static_cast<size_t>(rng() % 64), '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const auto ids = tok.encode(s, true);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.n_vocab());
  }
}

TEST(TokenizerUtf8, StrictScanner) {
  using moe::tokenizer::is_valid_utf8;
  using moe::tokenizer::utf8_lossy;
  EXPECT_TRUE(is_valid_utf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));          // overlong
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(is_valid_utf8("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(is_valid_utf8("\xE2\x82"));
  EXPECT_EQ(utf8_lossy("\xE2\x82"
                       "A"),
            "\xEF\xBF\xBD"
            "A");  // one U+FFFD per maximal subpart
  EXPECT_EQ(utf8_lossy("\xFF\xC0"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xF0\x9F\x98"), "\xEF\xBF\xBD");
}

TEST(TokenizerByteLevel, Mapping) {
  using moe::tokenizer::byte_level_decode;
  using moe::tokenizer::byte_level_encode;
  EXPECT_EQ(byte_level_encode(" "), "\xC4\xA0");   // U+0120
  EXPECT_EQ(byte_level_encode("\n"), "\xC4\x8A");  // U+010A
  EXPECT_EQ(byte_level_encode("a!"), "a!");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level_decode(byte_level_encode(all)), all);
}

TEST(TokenizerRoundTrip, RandomTextDecodesBack) {
  const auto& tok = moe::test::qwen3_tokenizer();
  const std::vector<std::string> alphabet = {"a",
                                             "Z",
                                             " ",
                                             "  ",
                                             "\n",
                                             "\t",
                                             "'s",
                                             "1",
                                             "9",
                                             ".",
                                             "\xC3\xA9",
                                             "\xE4\xBD\xA0",
                                             "\xF0\x9F\x98\x80",
                                             "\xCC\x81",
                                             "<think>",
                                             "<|im_end|>",
                                             "\r\n"};
  std::mt19937 rng(11);
  for (int i = 0; i < 300; ++i) {
    std::string s;
    const size_t n = rng() % 40;
    for (size_t k = 0; k < n; ++k) s += alphabet[rng() % alphabet.size()];
    for (bool special : {false, true}) {
      EXPECT_EQ(tok.decode(tok.encode(s, special), false, true), s) << s;
    }
  }
}

TEST(TokenizerSpecial, Qwen3Ids) {
  const auto& tok = moe::test::qwen3_tokenizer();
  EXPECT_EQ(tok.n_vocab(), 151936);
  EXPECT_EQ(tok.bos_id(), 151643);
  EXPECT_EQ(tok.eos_id(), 151645);
  EXPECT_EQ(tok.pad_id(), 151643);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.vocab().n_merges(), 151387u);
  EXPECT_EQ(tok.vocab().eog_ids(), (std::vector<int32_t>{151643, 151645, 151662, 151663, 151664}));
  EXPECT_TRUE(tok.is_eog(151645));
  EXPECT_FALSE(tok.is_eog(151644));
  EXPECT_EQ(tok.encode("<|im_start|>user", true), (std::vector<int32_t>{151644, 872}));
  EXPECT_EQ(tok.token_piece(151644, false), "");
  EXPECT_EQ(tok.token_piece(151667, false), "<think>");
  EXPECT_EQ(tok.token_piece(151700, true), "");  // [PAD151700], UNUSED
  const std::vector<int32_t> bad = {9707, 151936};
  EXPECT_THROW(tok.decode(bad, false, true), moe::Error);
}

TEST(TokenizerSpeed, LongWordsAreNotQuadratic) {
  const auto& tok = moe::test::qwen3_tokenizer();
  std::mt19937 rng(5);
  std::string same(100000, 'a'), mixed(100000, ' '), digits(100000, '7'), spaces(100000, ' ');
  for (char& c : mixed) c = static_cast<char>('a' + rng() % 26);
  for (const std::string* s : {&same, &mixed, &digits, &spaces}) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto ids = tok.encode(*s, false);
    const double dt = seconds_since(t0);
    EXPECT_EQ(tok.decode(ids, false, true), *s);
    EXPECT_LT(dt, 2.0) << "100k-char input took " << dt << " s";
  }
}

TEST(TokenizerSpeed, LoadAndOneMegabyte) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto tok =
      moe::test::load_tokenizer(moe::test::testdata_dir() / "models" / "qwen3-vocab-only.gguf");
  const double load_s = seconds_since(t0);

  // ~1 MB of English-like text built from the prose goldens.
  std::string text;
  for (const auto& r : moe::test::read_jsonl(moe::test::tokenizer_golden("qwen3.jsonl"))) {
    const std::string cat = r.at("category").get<std::string>();
    if (cat == "prose" || cat == "contractions" || cat == "code" || cat == "punctuation") {
      text += r.at("text").get<std::string>() + "\n";
    }
  }
  std::mt19937 rng(9);
  std::vector<std::string> words;
  for (size_t b = 0, e; b < text.size(); b = e + 1) {
    e = text.find_first_of(" \n", b);
    if (e == std::string::npos) e = text.size();
    if (e > b) words.push_back(text.substr(b, e - b));
  }
  std::string big;
  while (big.size() < (1u << 20)) big += words[rng() % words.size()] + (rng() % 12 ? " " : "\n");

  const auto t1 = std::chrono::steady_clock::now();
  const auto ids = tok.encode(big, false);
  const double enc_s = seconds_since(t1);
  std::cout << "load " << load_s * 1e3 << " ms; encode 1 MiB: " << enc_s * 1e3 << " ms, "
            << ids.size() << " tokens\n";
  EXPECT_EQ(tok.decode(ids, false, true), big);
  // Generous bounds: the machine is shared and sanitizer builds are slow.
  EXPECT_LT(load_s, 2.0);
  EXPECT_LT(enc_s, 5.0);
}

}  // namespace
