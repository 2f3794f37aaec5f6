// The Qwen3 reply parser: fixed replies, the same replies split at every byte position (and every
// pair of positions), held-back text, malformed tool calls and tool-call ids.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "coordinator/http/qwen_output_parser.h"

namespace moe::http {
namespace {

struct Call {
  std::string name, arguments_json;
};

struct Case {
  const char* what;
  std::string input;
  bool reasoning_started;
  std::string reasoning, content;
  std::vector<Call> calls;
};

const char* const kSeed = "chatcmpl-test";

std::vector<Case> cases() {
  return {
      {"plain", "Hello, world!", false, "", "Hello, world!", {}},
      {"empty", "", false, "", "", {}},
      {"think",
       "<think>\nLet me think.\nOK.\n</think>\n\nThe answer is 4.",
       false,
       "Let me think.\nOK.",
       "The answer is 4.",
       {}},
      {"empty think (enable_thinking false in the reply)",
       "<think>\n\n</think>\n\nHi",
       false,
       "",
       "Hi",
       {}},
      {"reasoning started in the prompt",
       "Thinking here\n</think>\n\nDone",
       true,
       "Thinking here",
       "Done",
       {}},
      {"reasoning started, leading newline", "\nabc\n</think>\n\nx", true, "abc", "x", {}},
      {"unterminated think", "<think>\nstill thinking \n", false, "still thinking", "", {}},
      {"unterminated think with a partial closing tag",
       "<think>\nabc </thi",
       false,
       "abc </thi",
       "",
       {}},
      {"whitespace before <think>", "\n <think>r</think>c", false, "r", "c", {}},
      {"leading whitespace without think", "  Hi", false, "", "  Hi", {}},
      {"whitespace only", "\n\n", false, "", "\n\n", {}},
      {"trailing whitespace kept",
       "Line one\n\nLine two\n",
       false,
       "",
       "Line one\n\nLine two\n",
       {}},
      {"partial <think> at the start that is not one",
       "<thi is not a tag",
       false,
       "",
       "<thi is not a tag",
       {}},
      {"<think> later is text",
       "Hello <think>x</think> bye",
       false,
       "",
       "Hello <think>x</think> bye",
       {}},
      {"</think> without reasoning is text", "a</think>b", false, "", "a</think>b", {}},
      {"partial tool tag at the end", "Use a <tool", false, "", "Use a <tool", {}},
      {"two tool calls after reasoning",
       "<think>\nNeed weather.\n</think>\n\nLet me check.\n<tool_call>\n{\"name\": "
       "\"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
       "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
       false,
       "Need weather.",
       "Let me check.",
       {{"get_weather", R"({"city":"Paris","unit":"celsius"})"}, {"get_time", "{}"}}},
      {"tool call only, argument order kept",
       "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"z\": 1, \"a\": [1, 2]}}\n</tool_call>",
       false,
       "",
       "",
       {{"f", R"({"z":1,"a":[1,2]})"}}},
      {"text after a tool call",
       "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call>\n\nSome text",
       false,
       "",
       "Some text",
       {{"a", "{}"}}},
      {"arguments as a string",
       "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
       false,
       "",
       "",
       {{"f", "{\"a\": 1}"}}},
      {"no arguments", "<tool_call>{\"name\": \"f\"}</tool_call>", false, "", "", {{"f", "{}"}}},
      {"malformed JSON stays content",
       "Try:\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>\nafter",
       false,
       "",
       "Try:\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": }\n</tool_call>\nafter",
       {}},
      {"missing name stays content",
       "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
       false,
       "",
       "<tool_call>\n{\"arguments\": {}}\n</tool_call>",
       {}},
      {"name not a string stays content",
       "<tool_call>{\"name\": 3}</tool_call>",
       false,
       "",
       "<tool_call>{\"name\": 3}</tool_call>",
       {}},
      {"arguments array stays content",
       "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
       false,
       "",
       "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
       {}},
      {"JSON array body stays content",
       "x <tool_call>[1, 2]</tool_call>  y",
       false,
       "",
       "x <tool_call>[1, 2]</tool_call>  y",
       {}},
      {"unterminated tool call stays content",
       "Checking.\n<tool_call>\n{\"name\": \"f\"",
       false,
       "",
       "Checking.\n<tool_call>\n{\"name\": \"f\"",
       {}},
      {"unterminated after a good one",
       "<tool_call>{\"name\": \"a\"}</tool_call>\n<tool_call>{\"name\": \"b\"",
       false,
       "",
       "<tool_call>{\"name\": \"b\"",
       {{"a", "{}"}}},
      {"tool call inside reasoning is reasoning",
       "<think>\nMaybe <tool_call>{\"name\":\"f\"}</tool_call>\n</think>\n\nNo.",
       false,
       "Maybe <tool_call>{\"name\":\"f\"}</tool_call>",
       "No.",
       {}},
      {"text between tool calls loses the whitespace around them",
       "A\n<tool_call>{\"name\":\"a\"}</tool_call>\nB\n<tool_call>{\"name\":\"b\"}</tool_call>",
       false,
       "",
       "AB",
       {{"a", "{}"}, {"b", "{}"}}},
      {"UTF-8 everywhere",
       "<think>\n\xC3\xBC \xE2\x80\x94 \xE6\x80\x9D\xE8\x80\x83\n</think>\n\n\xC3\x84ntwort "
       "\xF0\x9F\x99\x82 <tool_call>\n{\"name\": \"s\xC3\xB6k\", \"arguments\": {\"q\": "
       "\"\xE6\x97\xA5\xE6\x9C\xAC\"}}\n</tool_call>",
       false,
       "\xC3\xBC \xE2\x80\x94 \xE6\x80\x9D\xE8\x80\x83",
       "\xC3\x84ntwort \xF0\x9F\x99\x82",
       {{"s\xC3\xB6k", "{\"q\":\"\xE6\x97\xA5\xE6\x9C\xAC\"}"}}},
  };
}

ParsedDelta run_pieces(const std::vector<std::string>& pieces, bool reasoning_started) {
  QwenOutputParser p(reasoning_started, kSeed);
  ParsedDelta all;
  for (const std::string& s : pieces) all.append(p.push(s));
  all.append(p.finish());
  return all;
}

ParsedDelta run_whole(const Case& c) { return run_pieces({c.input}, c.reasoning_started); }

// Whether `s` is valid UTF-8 (structure only; enough for split checks).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80         ? 1
                       : (c >> 5) == 6  ? 2
                       : (c >> 4) == 14 ? 3
                       : (c >> 3) == 30 ? 4
                                        : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

std::string describe(const ParsedDelta& d) {
  std::string s = "reasoning=[" + d.reasoning + "] content=[" + d.content + "] calls=";
  for (const ParsedToolCall& c : d.tool_calls) {
    s += "{" + c.id + " " + c.name + " " + c.arguments_json + "}";
  }
  return s;
}

TEST(QwenOutputParser, FixedReplies) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    const ParsedDelta d = run_whole(c);
    EXPECT_EQ(d.reasoning, c.reasoning);
    EXPECT_EQ(d.content, c.content);
    ASSERT_EQ(d.tool_calls.size(), c.calls.size()) << describe(d);
    for (size_t i = 0; i < c.calls.size(); ++i) {
      EXPECT_EQ(d.tool_calls[i].name, c.calls[i].name);
      EXPECT_EQ(d.tool_calls[i].arguments_json, c.calls[i].arguments_json);
      EXPECT_EQ(d.tool_calls[i].id, tool_call_id(kSeed, i));
    }
  }
}

TEST(QwenOutputParser, SplitAtEveryBytePositionGivesTheSameResult) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    const ParsedDelta whole = run_whole(c);
    for (size_t i = 0; i <= c.input.size(); ++i) {
      const ParsedDelta split =
          run_pieces({c.input.substr(0, i), c.input.substr(i)}, c.reasoning_started);
      ASSERT_EQ(split, whole) << "split at " << i << ": " << describe(split);
    }
  }
}

TEST(QwenOutputParser, SplitAtEveryPairOfPositionsGivesTheSameResult) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    const ParsedDelta whole = run_whole(c);
    const size_t n = c.input.size();
    for (size_t i = 0; i <= n; ++i) {
      for (size_t j = i; j <= n; ++j) {
        const ParsedDelta split =
            run_pieces({c.input.substr(0, i), c.input.substr(i, j - i), c.input.substr(j)},
                       c.reasoning_started);
        ASSERT_EQ(split, whole) << "split at " << i << ", " << j << ": " << describe(split);
      }
    }
  }
}

TEST(QwenOutputParser, ByteByByteGivesTheSameResultAndWholeCharacters) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.what);
    QwenOutputParser p(c.reasoning_started, kSeed);
    ParsedDelta all;
    for (const char ch : c.input) {
      const ParsedDelta d = p.push(std::string(1, ch));
      // Deltas never end inside a UTF-8 character, so each can be sent as JSON on its own.
      EXPECT_TRUE(valid_utf8(d.content)) << describe(d);
      EXPECT_TRUE(valid_utf8(d.reasoning)) << describe(d);
      all.append(d);
    }
    all.append(p.finish());
    EXPECT_EQ(all, run_whole(c)) << describe(all);
  }
}

TEST(QwenOutputParser, DecidedTextIsReturnedAtOnce) {
  QwenOutputParser p;
  EXPECT_EQ(p.push("Hello world").content, "Hello world");
  EXPECT_EQ(p.push(" and more").content, " and more");
}

TEST(QwenOutputParser, HoldsBackWhatMayBeATag) {
  QwenOutputParser p(false, kSeed);
  EXPECT_TRUE(p.push("<th").empty());  // may become <think>
  ParsedDelta d = p.push("ink>\nI ");
  EXPECT_EQ(d.reasoning, "I");  // the space may precede </think>
  EXPECT_EQ(p.push("am").reasoning, " am");
  EXPECT_TRUE(p.push("\n</thi").empty());
  d = p.push("nk>\n\n");
  EXPECT_TRUE(d.empty()) << describe(d);  // whitespace after </think> is dropped
  EXPECT_EQ(p.push("Hello <tool").content, "Hello");
  EXPECT_TRUE(p.push("_call>\n{\"name\": \"f\"").empty());
  d = p.push("}\n</tool_call>");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].name, "f");
  EXPECT_EQ(d.content, "");
  EXPECT_EQ(p.tool_call_count(), 1u);
  EXPECT_TRUE(p.finish().empty());
}

TEST(QwenOutputParser, FinishReleasesHeldText) {
  QwenOutputParser p;
  EXPECT_EQ(p.push("a <tool_ca").content, "a");
  const ParsedDelta d = p.finish();
  EXPECT_EQ(d.content, " <tool_ca");
  EXPECT_TRUE(d.tool_calls.empty());
}

TEST(QwenOutputParser, HoldsBackAnUnfinishedUtf8Character) {
  QwenOutputParser p;
  EXPECT_EQ(p.push("caf\xC3").content, "caf");
  EXPECT_EQ(p.push("\xA9!").content, "\xC3\xA9!");
  EXPECT_EQ(p.push("\xF0\x9F").content, "");
  EXPECT_EQ(p.push("\x99\x82").content, "\xF0\x9F\x99\x82");
}

TEST(QwenOutputParser, ReasoningStartedSkipsTheThinkTagCheck) {
  // With reasoning_started, the text is reasoning until </think> even if it begins like a tag.
  QwenOutputParser p(true);
  ParsedDelta all = p.push("<tool_call>x</tool_call> hmm</think>\n\nok");
  all.append(p.finish());
  EXPECT_EQ(all.reasoning, "<tool_call>x</tool_call> hmm");
  EXPECT_EQ(all.content, "ok");
}

TEST(QwenOutputParser, ToolCallIds) {
  const std::string id0 = tool_call_id("chatcmpl-abc", 0);
  const std::string id1 = tool_call_id("chatcmpl-abc", 1);
  for (const std::string& id : {id0, id1}) {
    ASSERT_EQ(id.size(), 5u + 22u) << id;
    EXPECT_EQ(id.substr(0, 5), "call_");
    for (const char c : id.substr(5))
      EXPECT_TRUE(std::isalnum(static_cast<unsigned char>(c))) << id;
  }
  EXPECT_NE(id0, id1);
  EXPECT_EQ(tool_call_id("chatcmpl-abc", 0), id0);  // deterministic
  EXPECT_NE(tool_call_id("chatcmpl-abd", 0), id0);  // per request
  std::set<std::string> ids;
  for (size_t n = 0; n < 20000; ++n) ids.insert(tool_call_id("x", n));
  EXPECT_EQ(ids.size(), 20000u);

  const std::string two =
      "<tool_call>{\"name\": \"a\"}</tool_call><tool_call>{\"name\": \"b\"}</tool_call>";
  QwenOutputParser p(false, "chatcmpl-abc");
  ParsedDelta d = p.push(two);
  d.append(p.finish());
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].id, id0);
  EXPECT_EQ(d.tool_calls[1].id, id1);
  QwenOutputParser other(false, "chatcmpl-xyz");
  ParsedDelta e = other.push(two);
  e.append(other.finish());
  ASSERT_EQ(e.tool_calls.size(), 2u);
  EXPECT_NE(e.tool_calls[0].id, id0);
}

TEST(QwenOutputParser, MalformedCallsDoNotUseUpIds) {
  QwenOutputParser p(false, kSeed);
  ParsedDelta d = p.push("<tool_call>{bad}</tool_call><tool_call>{\"name\": \"ok\"}</tool_call>");
  d.append(p.finish());
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].id, tool_call_id(kSeed, 0));
  EXPECT_EQ(d.content, "<tool_call>{bad}</tool_call>");
}

TEST(QwenOutputParser, UseAfterFinishIsAnError) {
  QwenOutputParser p;
  p.push("x");
  p.finish();
  EXPECT_THROW(p.push("y"), std::logic_error);
  EXPECT_THROW(p.finish(), std::logic_error);
}

TEST(ParsedDelta, AppendAndEmpty) {
  ParsedDelta a;
  EXPECT_TRUE(a.empty());
  ParsedDelta b;
  b.content = "c";
  b.reasoning = "r";
  b.tool_calls.push_back({"id", "n", "{}"});
  a.append(b);
  a.append(b);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a.content, "cc");
  EXPECT_EQ(a.reasoning, "rr");
  EXPECT_EQ(a.tool_calls.size(), 2u);
}

}  // namespace
}  // namespace moe::http
