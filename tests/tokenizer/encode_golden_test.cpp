// Encoding goldens: every record of qwen3.jsonl (real vocabulary) and qwen3-sv.jsonl (small
// vocabulary) must give llama.cpp's ids, and Hugging Face's ids where the two agree.
#include <gtest/gtest.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <iostream>

#include "tests/tokenizer/tokenizer_testing.h"

namespace {

using moe::test::ids_str;

std::string nfc(const std::string& s) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(status);
  icu::UnicodeString out = n->normalize(icu::UnicodeString::fromUTF8(s), status);
  if (U_FAILURE(status)) throw std::runtime_error("NFC failed");
  std::string r;
  out.toUTF8String(r);
  return r;
}

void check_file(const moe::tokenizer::Tokenizer& tok, const std::string& name) {
  const auto recs = moe::test::read_jsonl(moe::test::tokenizer_golden(name));
  ASSERT_EQ(recs.size(), 163u) << name;
  size_t pass = 0, hf_checked = 0, nfc_checked = 0;
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    const std::string text = moe::test::from_hex(r.at("text_utf8_hex").get<std::string>());
    const bool parse_special = r.at("parse_special").get<bool>();
    const auto want = r.at("ids_llamacpp").get<std::vector<int32_t>>();
    const auto got = tok.encode(text, parse_special);
    const std::string where = name + " record " + std::to_string(i) + " [" +
                              r.at("category").get<std::string>() +
                              "] parse_special=" + (parse_special ? "true" : "false") +
                              " text=" + nlohmann::json(r.at("text")).dump().substr(0, 200);
    if (got != want) {
      ADD_FAILURE() << where << "\n  got  " << ids_str(got) << "\n  want " << ids_str(want);
      continue;
    }
    ++pass;
    if (r.at("agree").get<bool>()) {
      EXPECT_EQ(got, r.at("ids_hf").get<std::vector<int32_t>>()) << where;
      ++hf_checked;
    }
    if (r.at("nfc_changes_text").get<bool>()) {
      // HF normalizes to NFC; our tokenizer (like llama.cpp) does not, but fed NFC text it must
      // give what llama.cpp gives for it.
      EXPECT_EQ(tok.encode(nfc(text), parse_special),
                r.at("ids_llamacpp_of_nfc_text").get<std::vector<int32_t>>())
          << where << " (NFC text)";
      ++nfc_checked;
    }
  }
  std::cout << name << ": " << pass << "/" << recs.size() << " records match llama.cpp ("
            << hf_checked << " also checked against HF, " << nfc_checked << " NFC variants)\n";
  EXPECT_EQ(pass, recs.size());
}

TEST(TokenizerGolden, Qwen3RealVocab) { check_file(moe::test::qwen3_tokenizer(), "qwen3.jsonl"); }

TEST(TokenizerGolden, Qwen3SmallVocab) { check_file(moe::test::sv_tokenizer(), "qwen3-sv.jsonl"); }

}  // namespace
