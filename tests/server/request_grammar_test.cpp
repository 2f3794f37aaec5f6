// The grammar a request gets: which think block a rendered prompt leaves the model, and that the
// block is free text up to the first "</think>" while what follows is constrained.
#include "coordinator/server/request_grammar.h"

#include <gtest/gtest.h>

#include "coordinator/server/request_validation.h"

namespace moe::server {
namespace {

TEST(RequestGrammar, ThinkModeFromTheRenderedPrompt) {
  EXPECT_EQ(think_mode("<|im_start|>assistant\n", true), ThinkMode::Open);
  EXPECT_EQ(think_mode("<|im_start|>assistant\n<think>\n\n</think>\n\n", true), ThinkMode::None);
  EXPECT_EQ(think_mode("<|im_start|>assistant\n<think>\n", true), ThinkMode::Inside);
  EXPECT_EQ(think_mode("<|im_start|>assistant\n<think>\n", false), ThinkMode::None);
}

v1::GenerateRequest schema_request() {
  v1::GenerateRequest r;
  r.set_json_schema(R"({"type": "object", "additionalProperties": false, "required": ["a"],
                        "properties": {"a": {"type": "integer"}}})");
  return r;
}

TEST(RequestGrammar, TheThinkBlockIsFreeAndTheAnswerConstrained) {
  const auto none = request_grammar(schema_request(), ThinkMode::None);
  ASSERT_TRUE(none);
  EXPECT_TRUE(grammar::matches(none, R"({"a": 12})"));
  EXPECT_FALSE(grammar::matches(none, R"(<think>x</think>{"a": 12})"));
  EXPECT_FALSE(grammar::matches(none, R"({"a": "x"})"));

  const auto open = request_grammar(schema_request(), ThinkMode::Open);
  EXPECT_TRUE(grammar::matches(open, R"({"a": 1})"));
  EXPECT_TRUE(
      grammar::matches(open, "<think>a < b, </thin, <<>/ {\"a\": 2}</think>\n\n{\"a\": 1}"));
  // Only the first "</think>" ends the block: what follows must be the answer.
  EXPECT_FALSE(grammar::matches(open, "<think>x</think> more</think>{\"a\": 1}"));
  EXPECT_FALSE(grammar::matches(open, "<think>x</think>\n\nnot json"));

  const auto inside = request_grammar(schema_request(), ThinkMode::Inside);
  EXPECT_TRUE(grammar::matches(inside, "thinking...</think>\n\n{\"a\": 3}"));
  EXPECT_TRUE(grammar::matches(inside, "</think>{\"a\": 3}"));
  EXPECT_FALSE(grammar::matches(inside, "{\"a\": 3}"));
}

TEST(RequestGrammar, ToolChoiceAndItsErrors) {
  v1::GenerateRequest r;
  v1::ChatInput& chat = *r.mutable_chat();
  chat.add_tools_json(R"({"type": "function", "function": {"name": "f", "parameters": {
      "type": "object", "additionalProperties": false, "required": ["x"],
      "properties": {"x": {"type": "boolean"}}}}})");
  EXPECT_EQ(request_grammar(r, ThinkMode::None), nullptr);  // auto: free text
  chat.set_tool_choice("required");
  const auto g = request_grammar(r, ThinkMode::None);
  ASSERT_TRUE(g);
  EXPECT_TRUE(grammar::matches(
      g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": true}}\n</tool_call>"));
  EXPECT_FALSE(grammar::matches(g, "no call"));
  chat.set_tool_choice("g");
  EXPECT_THROW(request_grammar(r, ThinkMode::None), BadRequest);
  chat.set_tool_choice("f");
  r.set_json_object(true);
  EXPECT_THROW(request_grammar(r, ThinkMode::None), BadRequest);
  v1::GenerateRequest no_tools;
  no_tools.mutable_chat()->set_tool_choice("required");
  EXPECT_THROW(request_grammar(no_tools, ThinkMode::None), BadRequest);
  v1::GenerateRequest bad;
  bad.set_grammar("root ::= (");
  try {
    request_grammar(bad, ThinkMode::None);
    FAIL() << "a bad grammar was accepted";
  } catch (const BadRequest& e) {
    EXPECT_NE(std::string(e.what()).find("grammar: "), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moe::server
