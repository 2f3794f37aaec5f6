// gpt-oss's tokenizer (o200k_harmony, pre-tokenizer gpt-4o) from the vocab-only GGUF of
// ../shared/testdata-gptoss: every golden string must give the model's own tokenizer's ids
// (ids_hf; on the 4 Hindi and Thai strings where llama.cpp differs, HF is the reference), and
// the pre-tokenizer's cased letter runs split as the regex does.
#include <gtest/gtest.h>

#include <iostream>

#include "coordinator/tokenizer/pretokenize.h"
#include "tests/testdata.h"
#include "tests/tokenizer/tokenizer_testing.h"

namespace {

using moe::test::ids_str;
using moe::tokenizer::pretokenize;
using moe::tokenizer::PreTokenizer;

const moe::tokenizer::Tokenizer& gptoss_tokenizer() {
  static const moe::tokenizer::Tokenizer t = moe::test::load_tokenizer(
      moe::test::gptoss_testdata_dir() / "models" / "gptoss-vocab-only.gguf");
  return t;
}

TEST(TokenizerGptOss, GoldenStringsGiveTheModelsIds) {
  const auto& tok = gptoss_tokenizer();
  EXPECT_EQ(tok.vocab().pre(), PreTokenizer::kGpt4o);
  const auto recs = moe::test::read_jsonl(moe::test::gptoss_testdata_dir() / "golden" /
                                          "tokenizer" / "gptoss.jsonl");
  ASSERT_EQ(recs.size(), 173u);
  size_t pass = 0, llama_agree = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    const std::string text = r.at("text").get<std::string>();
    const auto want = r.at("ids_hf").get<std::vector<int32_t>>();
    const auto got = tok.encode(text, r.at("parse_special").get<bool>());
    if (got != want) {
      ADD_FAILURE() << "record " << i << " [" << r.at("category").get<std::string>()
                    << "] text=" << nlohmann::json(text).dump().substr(0, 200) << "\n  got  "
                    << ids_str(got) << "\n  want " << ids_str(want);
      continue;
    }
    ++pass;
    if (r.at("agree").get<bool>()) ++llama_agree;
  }
  std::cout << "gptoss.jsonl: " << pass << "/" << recs.size() << " records match HF ("
            << llama_agree << " where llama.cpp agrees)\n";
  EXPECT_EQ(pass, recs.size());
}

// The regex's alternatives one by one (pieces joined with '|').
std::string pieces(std::string_view text) {
  std::string out;
  for (const std::string& p : pretokenize(PreTokenizer::kGpt4o, text)) {
    if (!out.empty()) out += '|';
    out += p;
  }
  return out;
}

TEST(TokenizerGptOss, PreTokenizerSplitsCasedRunsDigitsAndSlashes) {
  // Upper then lower in one piece; an all-caps word by the second alternative, with its space.
  EXPECT_EQ(pieces("Hello WORLD"), "Hello| WORLD");
  EXPECT_EQ(pieces("HELLOworld"), "HELLOworld");
  // A lower run ends where an upper letter starts the next piece (camel case).
  EXPECT_EQ(pieces("camelCaseWord"), "camel|Case|Word");
  // Contractions stay with their word, in either case; after a space an apostrophe is
  // punctuation (the optional prefix needs letters after it), so "'s" splits there.
  EXPECT_EQ(pieces("I'LL don't 's"), "I'LL| don't| '|s");
  // Digits in threes.
  EXPECT_EQ(pieces("1234567"), "123|456|7");
  // Punctuation takes one leading space and trailing newlines and slashes.
  EXPECT_EQ(pieces("a ...//\nb"), "a| ...//\n|b");
  // Caseless letters (CJK) are both upper and lower: one run.
  EXPECT_EQ(pieces("\xe4\xbd\xa0\xe5\xa5\xbd world"), "\xe4\xbd\xa0\xe5\xa5\xbd| world");
  // Spaces: all but the last before a word, newlines on their own.
  EXPECT_EQ(pieces("a   b\n\n c"), "a|  | b|\n\n| c");
}

}  // namespace

// Generation ends at <|return|> and <|call|>; <|end|> closes a message in the middle of a reply
// (analysis, then final), so it must not end generation (llama.cpp's rule for o200k_harmony).
TEST(TokenizerGptOss, EndOfGenerationTokens) {
  const auto& v = gptoss_tokenizer().vocab();
  const int32_t ret = v.find("<|return|>"), call = v.find("<|call|>"), end = v.find("<|end|>");
  ASSERT_GE(ret, 0);
  ASSERT_GE(call, 0);
  ASSERT_GE(end, 0);
  EXPECT_TRUE(v.is_eog(ret));
  EXPECT_TRUE(v.is_eog(call));
  EXPECT_FALSE(v.is_eog(end));
  EXPECT_FALSE(v.is_eog(v.find("<|channel|>")));
}
