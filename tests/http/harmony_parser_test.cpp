// The gpt-oss (harmony) reply parser: fixed replies, each also split at every byte position and
// at every pair of positions, malformed and unfinished tool calls, plain text without headers.
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "coordinator/http/harmony_output_parser.h"

namespace moe::http {
namespace {

struct Case {
  const char* what;
  std::string input;
  std::string reasoning, content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments JSON
};

const char* const kSeed = "chatcmpl-harmony";

std::vector<Case> cases() {
  const std::string analysis = "<|channel|>analysis<|message|>User says hi. Reply briefly.<|end|>";
  return {
      {"reasoning then final",
       analysis + "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>",
       "User says hi. Reply briefly.",
       "Hello! How can I help?",
       {}},
      {"final only, unterminated (max tokens)",
       "<|channel|>final<|message|>Partial answ",
       "",
       "Partial answ",
       {}},
      {"a tool call, recipient after the channel, constrained to json",
       analysis +
           "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
           "<|message|>{\"city\": \"Paris\", \"unit\": \"c\"}<|call|>",
       "User says hi. Reply briefly.",
       "",
       {{"get_weather", R"({"city":"Paris","unit":"c"})"}}},
      {"a tool call, recipient before the channel",
       "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.lookup"
       "<|channel|>commentary json<|message|>{\"q\": [1, 2]}<|call|>",
       "Need weather.",
       "",
       {{"lookup", R"({"q":[1,2]})"}}},
      {"a preamble on commentary, then a call",
       "<|channel|>commentary<|message|>Let me check.<|end|><|start|>assistant<|channel|>"
       "commentary to=functions.f<|message|>{}<|call|>",
       "",
       "Let me check.",
       {{"f", "{}"}}},
      {"malformed tool-call arguments stay content",
       "<|channel|>commentary to=functions.f<|message|>{not json<|call|>",
       "",
       "{not json",
       {}},
      {"an unfinished tool call is content",
       "<|channel|>commentary to=functions.f<|message|>{\"a\": 1",
       "",
       "{\"a\": 1",
       {}},
      {"plain text without a header",
       "Just text, no channels at all.",
       "",
       "Just text, no channels at all.",
       {}},
      {"multibyte text in both channels",
       "<|channel|>analysis<|message|>\xe6\x80\x9d\xe8\x80\x83 \xf0\x9f\x98\x80<|end|><|start|>"
       "assistant<|channel|>final<|message|>caf\xc3\xa9 <|return|>",
       "\xe6\x80\x9d\xe8\x80\x83 \xf0\x9f\x98\x80",
       "caf\xc3\xa9 ",
       {}},
      {"text between messages is content",
       "<|channel|>final<|message|>a<|end|>stray<|start|>assistant<|channel|>final<|message|>b",
       "",
       "astrayb",
       {}},
      {"a marker-like text inside a body",
       "<|channel|>final<|message|>use <| and |> freely<|return|>",
       "",
       "use <| and |> freely",
       {}},
      {"empty", "", "", "", {}},
  };
}

ParsedDelta parse_in_pieces(const std::string& input, const std::vector<size_t>& cuts) {
  HarmonyOutputParser p(kSeed);
  ParsedDelta all;
  size_t from = 0;
  for (const size_t cut : cuts) {
    all.append(p.push(std::string_view(input).substr(from, cut - from)));
    from = cut;
  }
  all.append(p.push(std::string_view(input).substr(from)));
  all.append(p.finish());
  return all;
}

void expect_case(const Case& c, const ParsedDelta& got, const std::string& how) {
  EXPECT_EQ(got.reasoning, c.reasoning) << c.what << " " << how;
  EXPECT_EQ(got.content, c.content) << c.what << " " << how;
  ASSERT_EQ(got.tool_calls.size(), c.calls.size()) << c.what << " " << how;
  for (size_t i = 0; i < c.calls.size(); ++i) {
    EXPECT_EQ(got.tool_calls[i].name, c.calls[i].first) << c.what << " " << how;
    EXPECT_EQ(got.tool_calls[i].arguments_json, c.calls[i].second) << c.what << " " << how;
    EXPECT_EQ(got.tool_calls[i].id, tool_call_id(kSeed, i)) << c.what << " " << how;
  }
}

TEST(HarmonyParser, WholeReplies) {
  for (const Case& c : cases()) expect_case(c, parse_in_pieces(c.input, {}), "whole");
}

TEST(HarmonyParser, SplitAtEveryByteAndEveryPair) {
  for (const Case& c : cases()) {
    const size_t n = c.input.size();
    for (size_t i = 0; i <= n; ++i) {
      expect_case(c, parse_in_pieces(c.input, {i}), "split at " + std::to_string(i));
      for (size_t j = i; j <= n && !HasFailure(); j += 3) {
        expect_case(c, parse_in_pieces(c.input, {i, j}),
                    "split at " + std::to_string(i) + "," + std::to_string(j));
      }
      if (HasFailure()) return;
    }
    // One byte per push.
    std::vector<size_t> every;
    for (size_t i = 1; i < n; ++i) every.push_back(i);
    expect_case(c, parse_in_pieces(c.input, every), "byte by byte");
  }
}

TEST(HarmonyParser, ReasoningAndContentStreamBeforeTheMessageEnds) {
  HarmonyOutputParser p(kSeed);
  EXPECT_TRUE(p.push("<|channel|>analysis<|mess").empty());
  EXPECT_EQ(p.push("age|>Thinking a").reasoning, "Thinking a");
  // A possible marker start and half a UTF-8 character are held back.
  EXPECT_EQ(p.push("bout it <|e").reasoning, "bout it ");
  EXPECT_EQ(p.push("nd|><|start|>assistant<|channel|>final<|message|>caf\xc3").content, "caf");
  EXPECT_EQ(p.push("\xa9").content, "\xc3\xa9");
  EXPECT_TRUE(p.finish().empty());
  EXPECT_THROW(p.push("x"), std::logic_error);
  EXPECT_THROW(p.finish(), std::logic_error);
}

TEST(HarmonyParser, AHeaderLongerThanAHeaderCanBeIsText) {
  const std::string text(400, 'x');
  HarmonyOutputParser p;
  ParsedDelta all = p.push(text + "<|message|>y");
  all.append(p.finish());
  EXPECT_EQ(all.content, text + "<|message|>y");
  EXPECT_TRUE(all.reasoning.empty());
}

}  // namespace
}  // namespace moe::http
