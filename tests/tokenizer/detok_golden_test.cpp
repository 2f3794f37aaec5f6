// Detokenization goldens (qwen3-detok.jsonl, real vocabulary): pieces with and without special
// rendering, whole-sequence detokenization, and the streaming detokenizer.
#include <gtest/gtest.h>

#include "common/error.h"
#include "coordinator/tokenizer/stream_detokenizer.h"
#include "coordinator/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_testing.h"

namespace {

using moe::test::from_hex;
using moe::test::to_hex;
using moe::tokenizer::is_valid_utf8;

TEST(TokenizerDetokGolden, PiecesAndDetok) {
  const auto& tok = moe::test::qwen3_tokenizer();
  const auto recs = moe::test::read_jsonl(moe::test::tokenizer_golden("qwen3-detok.jsonl"));
  ASSERT_EQ(recs.size(), 30u);
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    SCOPED_TRACE("record " + std::to_string(i) + ": " + r.at("note").get<std::string>());
    const auto ids = r.at("ids").get<std::vector<int32_t>>();
    const auto pieces = r.at("pieces_hex").get<std::vector<std::string>>();
    const auto pieces_nosp = r.at("pieces_hex_special_false").get<std::vector<std::string>>();
    ASSERT_EQ(pieces.size(), ids.size());
    std::vector<size_t> invalid_alone;
    for (size_t k = 0; k < ids.size(); ++k) {
      EXPECT_EQ(to_hex(tok.token_piece(ids[k], true)), pieces[k]) << "id " << ids[k];
      EXPECT_EQ(to_hex(tok.token_piece(ids[k], false)), pieces_nosp[k]) << "id " << ids[k];
      if (!is_valid_utf8(tok.token_piece(ids[k], true))) invalid_alone.push_back(k);
    }
    EXPECT_EQ(invalid_alone, r.at("pieces_not_valid_utf8_alone").get<std::vector<size_t>>());
    const std::string detok = tok.decode(ids, false, true);
    EXPECT_EQ(to_hex(detok), r.at("detok_hex").get<std::string>());
    EXPECT_EQ(to_hex(tok.decode(ids, true, true)),
              r.at("detok_hex_remove_special").get<std::string>());
    EXPECT_EQ(is_valid_utf8(detok), r.at("detok_is_valid_utf8").get<bool>());
  }
}

TEST(TokenizerDetokGolden, Streaming) {
  const auto& tok = moe::test::qwen3_tokenizer();
  const auto recs = moe::test::read_jsonl(moe::test::tokenizer_golden("qwen3-detok.jsonl"));
  ASSERT_EQ(recs.size(), 30u);
  for (size_t i = 0; i < recs.size(); ++i) {
    const auto& r = recs[i];
    SCOPED_TRACE("record " + std::to_string(i) + ": " + r.at("note").get<std::string>());
    const auto ids = r.at("ids").get<std::vector<int32_t>>();
    const std::string detok = from_hex(r.at("detok_hex").get<std::string>());
    moe::tokenizer::StreamDetokenizer stream(tok);
    std::string all;
    for (int32_t id : ids) {
      const std::string chunk = stream.push(id);
      EXPECT_TRUE(is_valid_utf8(chunk)) << "chunk " << to_hex(chunk) << " after id " << id;
      all += chunk;
    }
    const std::string tail = stream.finish();
    EXPECT_TRUE(is_valid_utf8(tail));
    all += tail;
    if (r.at("detok_is_valid_utf8").get<bool>()) {
      EXPECT_EQ(to_hex(all), to_hex(detok));
    }
    // Invalid bytes become U+FFFD: the same text as a lossy decoder (HF's decode) shows.
    EXPECT_EQ(all, moe::tokenizer::utf8_lossy(detok));
    EXPECT_EQ(all, r.at("text_hf").get<std::string>());
  }
}

TEST(TokenizerDetok, StreamingHoldsSplitCharacters) {
  const auto& tok = moe::test::qwen3_tokenizer();
  // U+20AC as three byte tokens: nothing until the last byte arrives.
  moe::tokenizer::StreamDetokenizer s(tok);
  EXPECT_EQ(s.push(158), "");
  EXPECT_EQ(s.push(224), "");
  EXPECT_EQ(s.push(105), "\xE2\x82\xAC");
  EXPECT_EQ(s.finish(), "");
  // A character cut short is flushed as U+FFFD by finish(), or as soon as a byte breaks it.
  EXPECT_EQ(s.push(158), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");
  EXPECT_EQ(s.push(158), "");
  EXPECT_EQ(s.push(tok.encode("A", false).at(0)),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_THROW(s.push(tok.n_vocab()), moe::Error);
  // Control tokens are rendered only when asked.
  moe::tokenizer::StreamDetokenizer plain(tok, /*special=*/false);
  EXPECT_EQ(plain.push(151644), "");
  EXPECT_EQ(s.push(151644), "<|im_start|>");
}

}  // namespace
