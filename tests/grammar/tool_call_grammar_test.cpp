// Qwen3 tool-call grammar: what it accepts is what Qwen3's template renders and what
// QwenOutputParser reads back as tool calls; wrong names, invalid arguments and an unexpected think
// block are refused.
#include "coordinator/grammar/tool_call_grammar.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/grammar/grammar.h"
#include "coordinator/grammar/json_schema_grammar.h"
#include "coordinator/http/qwen_output_parser.h"

namespace moe::grammar {
namespace {

using Json = nlohmann::ordered_json;

// The tools of tests/chat_template's goldens (golden/chat/qwen3.jsonl).
std::vector<Json> golden_tools() {
  return {
      Json::parse(R"({"type": "function", "function": {"name": "get_weather",
          "description": "Get the current weather for a city.", "parameters": {"type": "object",
          "properties": {"city": {"type": "string", "description": "City name"},
          "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}})"),
      Json::parse(R"({"type": "function", "function": {"name": "web_search",
          "description": "Search the web and return the top results.", "parameters": {"type": "object",
          "properties": {"query": {"type": "string"}, "max_results": {"type": "integer", "minimum": 1,
          "maximum": 10}, "sites": {"type": "array", "items": {"type": "string"}}}, "required": ["query"]}}})"),
      Json::parse(
          R"({"type": "function", "function": {"name": "now", "description": "No parameters."}})"),
  };
}

std::string call(const std::string& name, const std::string& args) {
  return "<tool_call>\n{\"name\": \"" + name + "\", \"arguments\": " + args + "}\n</tool_call>";
}

std::shared_ptr<const Grammar> compile(const ToolCallGrammarOptions& opt) {
  const std::string gbnf = tool_call_gbnf(opt);
  return Grammar::parse(gbnf);
}

// What the server would report for `text`: the parser's tool calls, with no content left over.
std::vector<http::ParsedToolCall> parsed_calls(const std::string& text) {
  http::QwenOutputParser parser(false, "seed");
  http::ParsedDelta all = parser.push(text);
  all.append(parser.finish());
  EXPECT_EQ(all.content, "") << text;
  return all.tool_calls;
}

TEST(ToolCallGrammar, AcceptsTheTemplatesCallsAndTheParserReadsThem) {
  ToolCallGrammarOptions opt;
  opt.tools = golden_tools();
  const auto g = compile(opt);
  const std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> good =
      {
          {call("get_weather", R"({"city": "Paris"})"), {{"get_weather", R"({"city":"Paris"})"}}},
          {call("get_weather", R"({"city": "Paris", "unit": "celsius"})"),
           {{"get_weather", R"({"city":"Paris","unit":"celsius"})"}}},
          // The chat template golden's "unicode and escapes in tool arguments".
          {call("web_search",
                "{\"query\": \"東京 \\\"quoted\\\" \\\\ back\\nslash 😀\", \"sites\": "
                "[\"例え.jp\"]}"),
           {{"web_search",
             "{\"query\":\"東京 \\\"quoted\\\" \\\\ back\\nslash 😀\",\"sites\":[\"例え.jp\"]}"}}},
          {call("web_search", R"({"query": "x", "max_results": 10})"),
           {{"web_search", R"({"query":"x","max_results":10})"}}},
          {call("now", "{}"), {{"now", "{}"}}},
          {call("now", R"({"anything": [1, {"a": null}]})"),
           {{"now", R"({"anything":[1,{"a":null}]})"}}},
          // Two calls in one turn, as the template renders them.
          {call("get_weather", R"({"city": "Paris"})") + "\n" +
               call("get_weather", R"({"city": "Rome"})"),
           {{"get_weather", R"({"city":"Paris"})"}, {"get_weather", R"({"city":"Rome"})"}}},
      };
  for (const auto& [text, expected] : good) {
    SCOPED_TRACE(text);
    EXPECT_TRUE(matches(g, text));
    const auto calls = parsed_calls(text);
    ASSERT_EQ(calls.size(), expected.size());
    for (size_t i = 0; i < calls.size(); ++i) {
      EXPECT_EQ(calls[i].name, expected[i].first);
      EXPECT_EQ(calls[i].arguments_json, expected[i].second);
    }
  }
}

TEST(ToolCallGrammar, RefusesWrongNamesInvalidArgumentsAndOtherText) {
  ToolCallGrammarOptions opt;
  opt.tools = golden_tools();
  const auto g = compile(opt);
  for (const std::string& text : std::vector<std::string>{
           call("get_wether", R"({"city": "Paris"})"),                  // unknown function
           call("get_weather", R"({})"),                                // missing required
           call("get_weather", R"({"city": 5})"),                       // wrong type
           call("get_weather", R"({"city": "Paris", "unit": "K"})"),    // not in the enum
           call("web_search", R"({"query": "x", "max_results": 11})"),  // over the maximum
           call("web_search", R"({"query": "x", "sites": "a"})"),       // not an array
           call("now", "[]"),                                           // arguments not an object
           std::string("Sure! ") + call("now", "{}"),                   // text before
           call("now", "{}") + " done",                                 // text after
           "<tool_call>\n{\"arguments\": {}, \"name\": \"now\"}\n</tool_call>",
           call("now", "{}") + "\n",
           "",
       }) {
    EXPECT_FALSE(matches(g, text)) << text;
  }
}

TEST(ToolCallGrammar, ParallelOnlyFunctionAndThink) {
  ToolCallGrammarOptions opt;
  opt.tools = golden_tools();
  const std::string two = call("now", "{}") + "\n" + call("get_weather", R"({"city": "Oslo"})");
  opt.parallel = false;
  auto g = compile(opt);
  EXPECT_TRUE(matches(g, call("now", "{}")));
  EXPECT_FALSE(matches(g, two));

  opt.parallel = true;
  opt.only_function = "web_search";
  g = compile(opt);
  EXPECT_TRUE(matches(g, call("web_search", R"({"query": "a"})")));
  EXPECT_TRUE(matches(
      g, call("web_search", R"({"query": "a"})") + "\n" + call("web_search", R"({"query": "b"})")));
  EXPECT_FALSE(matches(g, call("now", "{}")));
  EXPECT_FALSE(matches(g, two));

  // Parallel calls are bounded.
  opt.only_function.clear();
  g = compile(opt);
  std::string many = call("now", "{}");
  for (size_t i = 1; i < kMaxParallelCalls; ++i) many.append("\n").append(call("now", "{}"));
  EXPECT_TRUE(matches(g, many));
  EXPECT_FALSE(matches(g, many + "\n" + call("now", "{}")));

  const std::string think = "<think>\nI should call get_weather.\n</think>\n\n";
  EXPECT_FALSE(matches(g, think + two));
  opt.allow_think = true;
  g = compile(opt);
  EXPECT_TRUE(matches(g, two));
  EXPECT_TRUE(matches(g, think + two));
  EXPECT_TRUE(matches(g, "<think></think>" + two));
  EXPECT_TRUE(matches(g, "<think>a < b, <</thin <x </think\n</think>" + two));
  EXPECT_TRUE(matches(g, "<think>ends in a tag start </thin</think>" + two));
  EXPECT_FALSE(matches(g, "<think>one</think>two</think>" + two));
  EXPECT_FALSE(matches(g, "<think>unterminated " + two));
  EXPECT_FALSE(matches(g, " <think></think>" + two));
  const auto calls = parsed_calls(think + two);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[1].name, "get_weather");
}

TEST(ToolCallGrammar, ThinkPrefixWrapsAnotherGrammar) {
  const std::string inner =
      json_schema_to_gbnf(Json::parse(R"({"type": "object", "properties": {"a":
      {"type": "integer"}}, "required": ["a"], "additionalProperties": false})"),
                          {"resp-"});
  const auto g = Grammar::parse(inner + think_prefix_gbnf("resp-root"));
  EXPECT_TRUE(matches(g, R"({"a": 1})"));
  EXPECT_TRUE(matches(g, "<think>\nhmm {\"a\": 2}?\n</think>\n\n{\"a\": 1}"));
  EXPECT_FALSE(matches(g, "<think>x</think>{\"a\": \"1\"}"));
  EXPECT_FALSE(matches(g, "<think>x</think>"));
}

void expect_error(const ToolCallGrammarOptions& opt, const std::string& what) {
  try {
    tool_call_gbnf(opt);
    ADD_FAILURE() << "not refused: " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(ToolCallGrammar, RefusesBadTools) {
  ToolCallGrammarOptions opt;
  expect_error(opt, "no tools");
  opt.tools = golden_tools();
  opt.only_function = "get_time";
  expect_error(opt, "'get_time', which is not among the tools");
  opt.only_function.clear();
  opt.tools.push_back(Json::parse(R"({"type": "function", "function": {"parameters": {}}})"));
  expect_error(opt, "tools[3]: the function has no name");
  opt.tools.back() = Json::parse(R"({"type": "function", "function": {"name": "now"}})");
  expect_error(opt, "tools[3]: function 'now' is defined twice");
  opt.tools.back() = Json::parse(
      R"({"type": "function", "function": {"name": "re", "parameters": {"type": "object",
          "properties": {"x": {"type": "string", "pattern": "a+"}}}}})");
  expect_error(opt, "tools[3] (function 're'): parameters: json_schema: #/properties/x/pattern");
  opt.tools.back() = Json::parse(
      R"({"type": "function", "function": {"name": "s", "parameters": {"type": "string"}}})");
  expect_error(opt, "tools[3] (function 's'): parameters must have type \"object\"");
  opt.tools.back() = Json::parse(R"({"type": "retrieval"})");
  expect_error(opt, "tools[3]: type \"retrieval\" is not supported");
}

// A parameters schema without "type" is an object schema.
TEST(ToolCallGrammar, ParametersWithoutTypeAreObjects) {
  ToolCallGrammarOptions opt;
  opt.tools = {Json::parse(R"({"type": "function", "function": {"name": "f", "parameters":
      {"properties": {"n": {"type": "integer"}}, "required": ["n"]}}})")};
  const auto g = compile(opt);
  EXPECT_TRUE(matches(g, call("f", R"({"n": 3})")));
  EXPECT_FALSE(matches(g, call("f", "3")));
  EXPECT_FALSE(matches(g, call("f", R"({"n": "3"})")));
}

}  // namespace
}  // namespace moe::grammar
