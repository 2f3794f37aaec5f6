// The reply parser the HTTP server picks by the model's vocabulary, and the end-of-generation
// token handed to it: harmony's <|call|> completes a tool call that the reply's text alone leaves
// unfinished; Qwen3's <|im_end|> adds nothing.
#include "coordinator/http/reply_parser.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/testdata.h"
#include "tests/tokenizer/tokenizer_testing.h"

namespace moe::http {
namespace {

TEST(ReplyParser, FormatFollowsTheVocabulary) {
  const auto harmony =
      test::load_tokenizer(test::gptoss_testdata_dir() / "models" / "gptoss-vocab-only.gguf");
  EXPECT_EQ(reply_format(harmony.vocab()), ReplyFormat::kHarmony);
  EXPECT_EQ(reply_format(test::qwen3_tokenizer().vocab()), ReplyFormat::kQwen);
}

const std::string kCall =
    "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>"
    "commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";

TEST(ReplyParser, HarmonyEndTokenCompletesAToolCall) {
  const auto p = make_reply_parser(ReplyFormat::kHarmony, false, "chatcmpl-1");
  ParsedDelta all = p->push(kCall);
  all.append(p->end_token("<|call|>"));
  all.append(p->finish());
  EXPECT_EQ(all.reasoning, "Need the weather.");
  EXPECT_EQ(all.content, "");
  ASSERT_EQ(all.tool_calls.size(), 1u);
  EXPECT_EQ(all.tool_calls[0].name, "get_weather");
  EXPECT_EQ(all.tool_calls[0].arguments_json, R"({"city":"Paris"})");
  EXPECT_EQ(p->tool_call_count(), 1u);

  // Without the end token (the reply stopped at max_tokens) the call is unfinished: content.
  const auto q = make_reply_parser(ReplyFormat::kHarmony, false, "chatcmpl-1");
  ParsedDelta cut = q->push(kCall);
  cut.append(q->finish());
  EXPECT_TRUE(cut.tool_calls.empty());
  EXPECT_NE(cut.content.find("Paris"), std::string::npos);
}

TEST(ReplyParser, HarmonyReturnEndsTheFinalMessage) {
  const auto p = make_reply_parser(ReplyFormat::kHarmony, false, "chatcmpl-2");
  ParsedDelta all = p->push("<|channel|>final<|message|>Hi there");
  all.append(p->end_token("<|return|>"));
  all.append(p->finish());
  EXPECT_EQ(all.content, "Hi there");
  EXPECT_TRUE(all.reasoning.empty());
}

TEST(ReplyParser, QwenIgnoresItsEndToken) {
  const auto p = make_reply_parser(ReplyFormat::kQwen, true, "chatcmpl-3");
  ParsedDelta all = p->push("Thinking.\n</think>\n\nThe answer.");
  EXPECT_TRUE(p->end_token("<|im_end|>").empty());
  all.append(p->finish());
  EXPECT_EQ(all.reasoning, "Thinking.");
  EXPECT_EQ(all.content, "The answer.");
}

}  // namespace
}  // namespace moe::http
