// The OpenAI-compatible request translation: every field, every refusal.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "coordinator/http/openai_request.h"

namespace moe::http {
namespace {

using J = nlohmann::ordered_json;

J parse(const std::string& text) { return J::parse(text); }

// A chat body with one user message plus the given top-level keys.
J chat(const std::string& extra_keys = "") {
  return parse(R"({"messages": [{"role": "user", "content": "hi"}])" +
               (extra_keys.empty() ? std::string() : ", " + extra_keys) + "}");
}

// A completions body with a text prompt plus the given top-level keys.
J text(const std::string& extra_keys = "") {
  return parse(R"({"prompt": "Once upon a time")" +
               (extra_keys.empty() ? std::string() : ", " + extra_keys) + "}");
}

HttpError error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const HttpError& e) {
    return e;
  }
  ADD_FAILURE() << "no HttpError was thrown";
  return HttpError(0, "(none)");
}

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The body is refused with 400 invalid_request_error; the message contains `needle` and `param`
// names the field.
void expect_bad(const std::function<v1::GenerateRequest(const J&)>& translate, const J& body,
                const std::string& needle, const std::optional<std::string>& param) {
  SCOPED_TRACE(body.dump());
  const HttpError e = error_of([&] { translate(body); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_TRUE(contains(e.what(), needle)) << "message: " << e.what() << "\nwanted: " << needle;
  EXPECT_EQ(e.param, param);
}

v1::GenerateRequest chat_req(const J& body) { return chat_completion_request(body, nullptr); }
v1::GenerateRequest text_req(const J& body) { return completion_request(body, nullptr); }

void expect_bad_chat(const std::string& extra, const std::string& needle,
                     const std::optional<std::string>& param) {
  expect_bad(chat_req, chat(extra), needle, param);
}
void expect_bad_text(const std::string& extra, const std::string& needle,
                     const std::optional<std::string>& param) {
  expect_bad(text_req, text(extra), needle, param);
}

// A chat body whose messages array is `messages` (JSON text).
J with_messages(const std::string& messages) { return parse(R"({"messages": )" + messages + "}"); }

void expect_bad_messages(const std::string& messages, const std::string& needle,
                         const std::optional<std::string>& param) {
  expect_bad(chat_req, with_messages(messages), needle, param);
}

// ---------------------------------------------------------------------------------------------
// Chat requests

TEST(ChatRequest, MinimalLeavesEverythingToServerDefaults) {
  OpenAiOptions opts;
  opts.stream = true;  // overwritten
  opts.model = "stale";
  const v1::GenerateRequest r = chat_completion_request(chat(), &opts);
  ASSERT_EQ(r.input_case(), v1::GenerateRequest::kChat);
  ASSERT_EQ(r.chat().messages_size(), 1);
  EXPECT_EQ(r.chat().messages(0).role(), "user");
  EXPECT_EQ(r.chat().messages(0).content(), "hi");
  EXPECT_EQ(r.chat().tools_json_size(), 0);
  EXPECT_FALSE(r.chat().has_enable_thinking());
  EXPECT_FALSE(r.chat().has_add_generation_prompt());
  EXPECT_FALSE(r.has_sampling() && r.sampling().ByteSizeLong() > 0);
  EXPECT_EQ(r.max_tokens(), 0);
  EXPECT_EQ(r.stop_size(), 0);
  EXPECT_FALSE(r.has_seed());
  EXPECT_FALSE(r.ignore_eos());
  EXPECT_FALSE(opts.stream);
  EXPECT_FALSE(opts.include_usage);
  EXPECT_EQ(opts.model, "");
}

TEST(ChatRequest, AllMessageFields) {
  const J body = with_messages(R"([
    {"role": "developer", "content": "Be brief."},
    {"role": "system", "content": null},
    {"role": "user", "name": "ann", "content": [{"type": "text", "text": "Weather in"},
                                                {"type": "text", "text": "Paris?"}]},
    {"role": "assistant", "content": null, "reasoning_content": "Use the tool.",
     "refusal": null, "annotations": [],
     "tool_calls": [
       {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
       {"index": 1, "function": {"name": "get_time", "arguments": {"zone": "CET", "a": 1}}},
       {"function": {"name": "noop"}}]},
    {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny"}
  ])");
  const v1::GenerateRequest r = chat_req(body);
  const v1::ChatInput& c = r.chat();
  ASSERT_EQ(c.messages_size(), 5);
  EXPECT_EQ(c.messages(0).role(), "system");  // developer is OpenAI's newer name
  EXPECT_EQ(c.messages(0).content(), "Be brief.");
  EXPECT_EQ(c.messages(1).role(), "system");
  EXPECT_EQ(c.messages(1).content(), "");
  EXPECT_EQ(c.messages(2).role(), "user");
  EXPECT_EQ(c.messages(2).name(), "ann");
  EXPECT_EQ(c.messages(2).content(), "Weather in\nParis?");
  const v1::ChatMessage& a = c.messages(3);
  EXPECT_EQ(a.role(), "assistant");
  EXPECT_EQ(a.content(), "");
  EXPECT_EQ(a.reasoning_content(), "Use the tool.");
  ASSERT_EQ(a.tool_calls_size(), 3);
  EXPECT_EQ(a.tool_calls(0).id(), "call_1");
  EXPECT_EQ(a.tool_calls(0).name(), "get_weather");
  EXPECT_EQ(a.tool_calls(0).arguments_json(), R"({"city": "Paris"})");  // a string: as sent
  EXPECT_EQ(a.tool_calls(1).id(), "");
  EXPECT_EQ(a.tool_calls(1).name(), "get_time");
  EXPECT_EQ(a.tool_calls(1).arguments_json(), R"({"zone":"CET","a":1})");  // key order kept
  EXPECT_EQ(a.tool_calls(2).arguments_json(), "{}");
  const v1::ChatMessage& t = c.messages(4);
  EXPECT_EQ(t.role(), "tool");
  EXPECT_EQ(t.tool_call_id(), "call_1");
  EXPECT_EQ(t.name(), "get_weather");
  EXPECT_EQ(t.content(), "sunny");
}

TEST(ChatRequest, RolesAreLeftToTheValidator) {
  // The gRPC validator checks roles (and empty messages); the HTTP layer passes them through.
  EXPECT_EQ(chat_req(with_messages(R"([{"role": "narrator", "content": "x"}])"))
                .chat()
                .messages(0)
                .role(),
            "narrator");
  EXPECT_EQ(chat_req(with_messages("[]")).chat().messages_size(), 0);
}

TEST(ChatRequest, ToolsAreForwardedAsJsonTextInOrder) {
  const J body = chat(R"("tools": [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                     "required": ["city"]}}},
    {"type": "function", "function": {"name": "b"}}], "tool_choice": "auto",
    "parallel_tool_calls": true)");
  const v1::GenerateRequest r = chat_req(body);
  ASSERT_EQ(r.chat().tools_json_size(), 2);
  EXPECT_EQ(r.chat().tools_json(0),
            R"({"type":"function","function":{"name":"get_weather","description":"Weather.",)"
            R"("parameters":{"type":"object","properties":{"city":{"type":"string"}},)"
            R"("required":["city"]}}})");
  EXPECT_EQ(r.chat().tools_json(1), R"({"type":"function","function":{"name":"b"}})");
}

TEST(ChatRequest, ToolChoiceNoneIsForwarded) {
  const v1::GenerateRequest r =
      chat_req(chat(R"("tools": [{"type": "function", "function": {"name": "f"}}],
                       "tool_choice": "none")"));
  // The validator leaves them out of the prompt; here they are still checked.
  EXPECT_EQ(r.chat().tool_choice(), "none");
  expect_bad_chat(R"("tools": [{"type": "function", "function": {}}], "tool_choice": "none")",
                  "tools[0].function.name is required", "tools[0].function.name");
}

TEST(ChatRequest, ToolChoiceRequiredOrNamedAndParallelCalls) {
  EXPECT_EQ(chat_req(chat(R"("tool_choice": "required")")).chat().tool_choice(), "required");
  EXPECT_EQ(chat_req(chat(R"("tool_choice": "auto")")).chat().tool_choice(), "auto");
  const v1::GenerateRequest r = chat_req(chat(
      R"("tool_choice": {"type": "function", "function": {"name": "f"}}, "parallel_tool_calls": false)"));
  EXPECT_EQ(r.chat().tool_choice(), "f");
  ASSERT_TRUE(r.chat().has_parallel_tool_calls());
  EXPECT_FALSE(r.chat().parallel_tool_calls());
  EXPECT_FALSE(chat_req(chat()).chat().has_parallel_tool_calls());
}

TEST(ChatRequest, ToolErrors) {
  expect_bad_chat(R"("tool_choice": "always")", "tool_choice 'always' is not one of",
                  "tool_choice");
  expect_bad_chat(R"("tool_choice": {"type": "function"})", "tool_choice.function.name is required",
                  "tool_choice.function.name");
  expect_bad_chat(R"("tool_choice": {"type": "function", "function": {"name": "none"}})",
                  "is not a function name", "tool_choice.function.name");
  expect_bad_chat(R"("parallel_tool_calls": 1)", "parallel_tool_calls must be a boolean",
                  "parallel_tool_calls");
  expect_bad_chat(R"("tool_choice": 3)", "tool_choice must be a string, not number", "tool_choice");
  expect_bad_chat(R"("tools": {"type": "function"})", "tools must be an array, not object",
                  "tools");
  expect_bad_chat(R"("tools": ["f"])", "tools[0] must be an object, not string", "tools[0]");
  expect_bad_chat(R"("tools": [{"function": {"name": "f"}}])", "tools[0].type must be 'function'",
                  "tools[0].type");
  expect_bad_chat(R"("tools": [{"type": "code_interpreter"}])", "tools[0].type must be 'function'",
                  "tools[0].type");
  expect_bad_chat(R"("tools": [{"type": "function", "function": {"name": "f"}},
                               {"type": "function", "function": "g"}])",
                  "tools[1].function must be an object", "tools[1].function");
  expect_bad_chat(R"("tools": [{"type": "function", "function": {"name": 7}}])",
                  "tools[0].function.name must be a string, not number", "tools[0].function.name");
  expect_bad_chat(R"("tools": [{"type": "function", "function": {"name": ""}}])",
                  "tools[0].function.name is required", "tools[0].function.name");
}

TEST(ChatRequest, EverySamplingField) {
  const v1::GenerateRequest r = chat_req(chat(R"(
      "temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.01, "typical_p": 0.95,
      "repeat_penalty": 1.1, "repeat_last_n": 128, "presence_penalty": 0.5,
      "frequency_penalty": -0.25, "top_n_sigma": 1.5, "xtc_probability": 0.2,
      "xtc_threshold": 0.3, "dry_multiplier": 0.8, "dry_base": 2, "dry_allowed_length": 3,
      "dry_penalty_last_n": 256, "min_keep": 2, "samplers": "top_k;temperature",
      "seed": 1234, "ignore_eos": true, "max_tokens": 77, "stop": ["\n\n", "END"])"));
  const v1::SamplingParams& s = r.sampling();
  ASSERT_TRUE(s.has_temperature());
  EXPECT_FLOAT_EQ(s.temperature(), 0.7f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 20);
  EXPECT_FLOAT_EQ(s.min_p(), 0.01f);
  EXPECT_FLOAT_EQ(s.typical_p(), 0.95f);
  EXPECT_FLOAT_EQ(s.repeat_penalty(), 1.1f);
  EXPECT_EQ(s.repeat_last_n(), 128);
  EXPECT_FLOAT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty(), -0.25f);
  EXPECT_FLOAT_EQ(s.top_n_sigma(), 1.5f);
  EXPECT_FLOAT_EQ(s.xtc_probability(), 0.2f);
  EXPECT_FLOAT_EQ(s.xtc_threshold(), 0.3f);
  EXPECT_FLOAT_EQ(s.dry_multiplier(), 0.8f);
  EXPECT_FLOAT_EQ(s.dry_base(), 2.0f);
  EXPECT_EQ(s.dry_allowed_length(), 3);
  EXPECT_EQ(s.dry_penalty_last_n(), 256);
  EXPECT_EQ(s.min_keep(), 2);
  EXPECT_EQ(s.samplers(), "top_k;temperature");
  ASSERT_TRUE(r.has_seed());
  EXPECT_EQ(r.seed(), 1234u);
  EXPECT_TRUE(r.ignore_eos());
  EXPECT_EQ(r.max_tokens(), 77);
  ASSERT_EQ(r.stop_size(), 2);
  EXPECT_EQ(r.stop(0), "\n\n");
  EXPECT_EQ(r.stop(1), "END");
}

TEST(ChatRequest, OnlyPresentSamplingFieldsAreSet) {
  const v1::GenerateRequest r = chat_req(chat(R"("top_k": 5, "temperature": null)"));
  EXPECT_TRUE(r.sampling().has_top_k());
  EXPECT_FALSE(r.sampling().has_temperature());  // null = unset
  EXPECT_FALSE(r.sampling().has_top_p());
  EXPECT_FALSE(r.sampling().has_min_p());
  EXPECT_FALSE(r.sampling().has_repeat_penalty());
  EXPECT_FALSE(r.sampling().has_samplers());
}

TEST(ChatRequest, TemperatureZeroIsPassedThrough) {
  const v1::GenerateRequest r = chat_req(chat(R"("temperature": 0)"));
  ASSERT_TRUE(r.sampling().has_temperature());
  EXPECT_EQ(r.sampling().temperature(), 0.0f);
}

TEST(ChatRequest, SamplersAsArray) {
  EXPECT_EQ(
      chat_req(chat(R"("samplers": ["top_k", "min_p", "temperature"])")).sampling().samplers(),
      "top_k;min_p;temperature");
  expect_bad_chat(R"("samplers": ["top_k", 1])", "samplers[1] must be a string, not number",
                  "samplers[1]");
  expect_bad_chat(R"("samplers": 1)", "samplers must be a string or an array of strings",
                  "samplers");
}

// `"key": value` (built with append: GCC 12 warns falsely about "..." + std::string).
std::string key_value(const std::string& key, const std::string& value) {
  std::string s = "\"";
  s.append(key).append("\": ").append(value);
  return s;
}

TEST(ChatRequest, SamplingTypeErrorsNameTheField) {
  for (const std::string key : {"temperature", "top_p", "min_p", "typical_p", "repeat_penalty",
                                "presence_penalty", "frequency_penalty", "top_n_sigma",
                                "xtc_probability", "xtc_threshold", "dry_multiplier", "dry_base"}) {
    expect_bad_chat(key_value(key, "\"0.5\""), key + " must be a number, not string", key);
  }
  for (const std::string key :
       {"top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n", "min_keep"}) {
    expect_bad_chat(key_value(key, "true"), key + " must be an integer, not boolean", key);
    expect_bad_chat(key_value(key, "2.5"), key + " must be an integer, not number", key);
    expect_bad_chat(key_value(key, "3000000000"), key + " = 3000000000 is out of range", key);
  }
  expect_bad_chat(R"("temperature": 1e300)", "temperature = 1e+300 is out of range", "temperature");
  expect_bad_chat(R"("ignore_eos": 1)", "ignore_eos must be a boolean, not number", "ignore_eos");
  // An integral float is an integer (llama-server reads it so).
  EXPECT_EQ(chat_req(chat(R"("top_k": 7.0)")).sampling().top_k(), 7);
}

TEST(ChatRequest, Seed) {
  EXPECT_EQ(chat_req(chat(R"("seed": 0)")).seed(), 0u);
  EXPECT_EQ(chat_req(chat(R"("seed": 4294967295)")).seed(), 4294967295u);
  EXPECT_FALSE(chat_req(chat(R"("seed": -1)")).has_seed());  // llama-server: -1 = random
  expect_bad_chat(R"("seed": 4294967296)", "seed = 4294967296 is out of range", "seed");
  expect_bad_chat(R"("seed": -2)", "seed = -2 is out of range", "seed");
  expect_bad_chat(R"("seed": "42")", "seed must be an integer, not string", "seed");
}

TEST(ChatRequest, MaxTokens) {
  EXPECT_EQ(chat_req(chat(R"("max_tokens": 100)")).max_tokens(), 100);
  EXPECT_EQ(chat_req(chat(R"("max_completion_tokens": 50, "max_tokens": 100)")).max_tokens(), 50);
  EXPECT_EQ(chat_req(chat(R"("max_completion_tokens": null, "max_tokens": 100)")).max_tokens(),
            100);
  EXPECT_EQ(chat_req(chat(R"("n_predict": 9)")).max_tokens(), 9);
  EXPECT_EQ(chat_req(chat(R"("max_tokens": -1)")).max_tokens(), 0);  // no limit
  EXPECT_EQ(chat_req(chat(R"("max_tokens": 64.0)")).max_tokens(), 64);
  EXPECT_EQ(chat_req(chat(R"("max_tokens": 99999999999)")).max_tokens(),
            std::numeric_limits<int32_t>::max());
  expect_bad_chat(R"("max_tokens": 0)", "max_tokens = 0 must be at least 1", "max_tokens");
  expect_bad_chat(R"("max_completion_tokens": -5)", "max_completion_tokens = -5 must be at least 1",
                  "max_completion_tokens");
  expect_bad_chat(R"("max_tokens": "100")", "max_tokens must be an integer, not string",
                  "max_tokens");
  expect_bad_chat(R"("max_tokens": 1.5)", "max_tokens must be an integer", "max_tokens");
}

TEST(ChatRequest, Stop) {
  const v1::GenerateRequest one = chat_req(chat(R"("stop": "###")"));
  ASSERT_EQ(one.stop_size(), 1);
  EXPECT_EQ(one.stop(0), "###");
  EXPECT_EQ(chat_req(chat(R"("stop": null)")).stop_size(), 0);
  EXPECT_EQ(chat_req(chat(R"("stop": [])")).stop_size(), 0);
  expect_bad_chat(R"("stop": ["a", 2])", "stop[1] must be a string, not number", "stop[1]");
  expect_bad_chat(R"("stop": 2)", "stop must be a string or an array of strings, not number",
                  "stop");
}

TEST(ChatRequest, StreamModelAndUsageOptions) {
  OpenAiOptions o;
  chat_completion_request(
      chat(R"("stream": true, "stream_options": {"include_usage": true}, "model": "qwen3")"), &o);
  EXPECT_TRUE(o.stream);
  EXPECT_TRUE(o.include_usage);
  EXPECT_EQ(o.model, "qwen3");
  chat_completion_request(chat(R"("stream": false, "stream_options": null)"), &o);
  EXPECT_FALSE(o.stream);
  EXPECT_FALSE(o.include_usage);
  EXPECT_EQ(o.model, "");
  expect_bad_chat(R"("stream": "yes")", "stream must be a boolean, not string", "stream");
  expect_bad_chat(R"("stream_options": true)", "stream_options must be an object, not boolean",
                  "stream_options");
  expect_bad_chat(R"("stream_options": {"include_usage": 1})",
                  "stream_options.include_usage must be a boolean, not number",
                  "stream_options.include_usage");
  expect_bad_chat(R"("model": 3)", "model must be a string, not number", "model");
}

TEST(ChatRequest, EnableThinking) {
  const v1::GenerateRequest off =
      chat_req(chat(R"("chat_template_kwargs": {"enable_thinking": false})"));
  ASSERT_TRUE(off.chat().has_enable_thinking());
  EXPECT_FALSE(off.chat().enable_thinking());
  const v1::GenerateRequest on =
      chat_req(chat(R"("chat_template_kwargs": {"enable_thinking": true})"));
  ASSERT_TRUE(on.chat().has_enable_thinking());
  EXPECT_TRUE(on.chat().enable_thinking());
  EXPECT_FALSE(chat_req(chat(R"("chat_template_kwargs": {})")).chat().has_enable_thinking());
  expect_bad_chat(R"("chat_template_kwargs": {"enable_thinking": "no"})",
                  "chat_template_kwargs.enable_thinking must be a boolean, not string",
                  "chat_template_kwargs.enable_thinking");
  expect_bad_chat(R"("chat_template_kwargs": [])", "chat_template_kwargs must be an object",
                  "chat_template_kwargs");
}

// Other chat_template_kwargs and OpenAI's reasoning_effort reach the template as variables.
TEST(ChatRequest, TemplateVariables) {
  EXPECT_EQ(chat_req(chat(R"("chat_template_kwargs": {"reasoning_effort": "low", "x_1": [1]})"))
                .chat()
                .template_vars_json(),
            R"({"reasoning_effort":"low","x_1":[1]})");
  EXPECT_EQ(chat_req(chat(R"("reasoning_effort": "high")")).chat().template_vars_json(),
            R"({"reasoning_effort":"high"})");
  EXPECT_EQ(chat_req(chat(R"("chat_template_kwargs": {"enable_thinking": false})"))
                .chat()
                .template_vars_json(),
            "");
  expect_bad_chat(R"("reasoning_effort": "extreme")",
                  "reasoning_effort must be minimal, low, medium or high", "reasoning_effort");
  expect_bad_chat(R"("reasoning_effort": 1)", "reasoning_effort must be a string, not number",
                  "reasoning_effort");
  expect_bad_chat(
      R"("reasoning_effort": "high", "chat_template_kwargs": {"reasoning_effort": "low"})",
      "reasoning_effort differs from chat_template_kwargs.reasoning_effort", "reasoning_effort");
  expect_bad_chat(R"("chat_template_kwargs": {"a-b": 1})",
                  "chat_template_kwargs: 'a-b' is not a template variable name",
                  "chat_template_kwargs");
  expect_bad_chat(R"("chat_template_kwargs": {"1a": 1})",
                  "chat_template_kwargs: '1a' is not a template variable name",
                  "chat_template_kwargs");
  expect_bad_chat(R"("chat_template_kwargs": {"big": ")" + std::string(17000, 'x') + R"("})",
                  "chat_template_kwargs is over 16 KiB as JSON", "chat_template_kwargs");
}

TEST(ChatRequest, UnknownTopLevelKeysAreIgnored) {
  const v1::GenerateRequest r = chat_req(chat(R"(
      "user": "u-1", "metadata": {"k": "v"}, "store": false, "service_tier": "auto",
      "n": 1, "logprobs": false, "top_logprobs": 0, "response_format": {"type": "text"},
      "logit_bias": {}, "modalities": ["text"], "reasoning_format": "auto")"));
  EXPECT_EQ(r.chat().messages_size(), 1);
}

TEST(ChatRequest, UnsupportedFeaturesAreRefused) {
  expect_bad_chat(R"("n": 2)", "only n = 1 is supported", "n");
  expect_bad_chat(R"("n": 0)", "only n = 1 is supported", "n");
  expect_bad_chat(R"("response_format": "json")", "response_format must be an object",
                  "response_format");
  expect_bad_chat(R"("response_format": {})", "response_format.type is required",
                  "response_format.type");
  expect_bad_chat(R"("functions": [{"name": "f"}])", "functions (deprecated) is not supported",
                  "functions");
  expect_bad_chat(R"("function_call": "auto")", "function_call (deprecated) is not supported",
                  "function_call");
}

TEST(ChatRequest, BodyAndMessagesShape) {
  expect_bad(chat_req, parse("[]"), "the request body must be a JSON object, not array",
             std::nullopt);
  expect_bad(chat_req, parse(R"("hi")"), "must be a JSON object, not string", std::nullopt);
  expect_bad(chat_req, parse("{}"), "messages is required", "messages");
  expect_bad(chat_req, parse(R"({"messages": null})"), "messages is required", "messages");
  expect_bad(chat_req, parse(R"({"messages": "hi"})"), "messages must be an array, not string",
             "messages");
}

TEST(ChatRequest, UnknownMessageFieldIsNamed) {
  expect_bad_messages(R"([{"role": "system", "content": "a"}, {"role": "user", "content": "b"},
                          {"role": "user", "content": "c", "foo": 1}])",
                      "messages[2]: unknown field 'foo'", "messages[2].foo");
  // SDK echo fields are accepted only while empty.
  expect_bad_messages(R"([{"role": "assistant", "content": "", "refusal": "no"}])",
                      "messages[0]: unknown field 'refusal'", "messages[0].refusal");
  expect_bad_messages(
      R"([{"role": "assistant", "content": "", "function_call": {"name": "f", "arguments": "{}"}}])",
      "messages[0]: unknown field 'function_call'", "messages[0].function_call");
}

TEST(ChatRequest, MessageTypeErrorsNameTheField) {
  expect_bad_messages(R"(["hi"])", "messages[0] must be an object, not string", "messages[0]");
  expect_bad_messages(R"([{"content": "x"}])", "messages[0].role is required", "messages[0].role");
  expect_bad_messages(R"([{"role": 1, "content": "x"}])",
                      "messages[0].role must be a string, not number", "messages[0].role");
  expect_bad_messages(R"([{"role": "user", "content": 5}])",
                      "messages[0].content must be a string, null or an array of content parts",
                      "messages[0].content");
  expect_bad_messages(R"([{"role": "user", "content": "x", "name": 5}])",
                      "messages[0].name must be a string, not number", "messages[0].name");
  expect_bad_messages(R"([{"role": "tool", "content": "x", "tool_call_id": 5}])",
                      "messages[0].tool_call_id must be a string, not number",
                      "messages[0].tool_call_id");
  expect_bad_messages(R"([{"role": "assistant", "content": "x", "reasoning_content": []}])",
                      "messages[0].reasoning_content must be a string, not array",
                      "messages[0].reasoning_content");
}

TEST(ChatRequest, ContentParts) {
  expect_bad_messages(R"([{"role": "user", "content": [{"type": "text", "text": "a"},
                           {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}])",
                      "messages[0].content[1]: content part type 'image_url': only text content "
                      "is supported",
                      "messages[0].content[1].type");
  expect_bad_messages(R"([{"role": "user", "content": ["a"]}])",
                      "messages[0].content[0] must be an object, not string",
                      "messages[0].content[0]");
  expect_bad_messages(R"([{"role": "user", "content": [{"text": "a"}]}])",
                      "messages[0].content[0].type is required", "messages[0].content[0].type");
  expect_bad_messages(R"([{"role": "user", "content": [{"type": "text"}]}])",
                      "messages[0].content[0].text is required", "messages[0].content[0].text");
  expect_bad_messages(R"([{"role": "user", "content": [{"type": "text", "text": 1}]}])",
                      "messages[0].content[0].text must be a string, not number",
                      "messages[0].content[0].text");
  EXPECT_EQ(
      chat_req(with_messages(R"([{"role": "user", "content": []}])")).chat().messages(0).content(),
      "");
}

TEST(ChatRequest, ToolCallErrors) {
  const auto call = [](const std::string& c) {
    return R"([{"role": "assistant", "content": null, "tool_calls": [)" + c + "]}]";
  };
  expect_bad_messages(R"([{"role": "assistant", "tool_calls": {}}])",
                      "messages[0].tool_calls must be an array, not object",
                      "messages[0].tool_calls");
  expect_bad_messages(call(R"("x")"), "messages[0].tool_calls[0] must be an object, not string",
                      "messages[0].tool_calls[0]");
  expect_bad_messages(call(R"({"id": "a"})"), "messages[0].tool_calls[0].function is required",
                      "messages[0].tool_calls[0].function");
  expect_bad_messages(call(R"({"function": "f"})"),
                      "messages[0].tool_calls[0].function must be an object, not string",
                      "messages[0].tool_calls[0].function");
  expect_bad_messages(call(R"({"function": {"arguments": "{}"}})"),
                      "messages[0].tool_calls[0].function.name is required",
                      "messages[0].tool_calls[0].function.name");
  expect_bad_messages(call(R"({"function": {"name": "f", "arguments": [1]}})"),
                      "messages[0].tool_calls[0].function.arguments must be a string or an object",
                      "messages[0].tool_calls[0].function.arguments");
  expect_bad_messages(call(R"({"type": "web", "function": {"name": "f"}})"),
                      "messages[0].tool_calls[0].type must be 'function'",
                      "messages[0].tool_calls[0].type");
  expect_bad_messages(call(R"({"id": 1, "function": {"name": "f"}})"),
                      "messages[0].tool_calls[0].id must be a string, not number",
                      "messages[0].tool_calls[0].id");
  expect_bad_messages(call(R"({"function": {"name": "f"}, "extra": 1})"),
                      "messages[0].tool_calls[0]: unknown field 'extra'",
                      "messages[0].tool_calls[0].extra");
}

TEST(ChatRequest, PlainJsonOverload) {
  const nlohmann::json body = nlohmann::json::parse(
      R"({"messages": [{"role": "user", "content": "hi"}], "temperature": 0.25, "model": "m"})");
  OpenAiOptions o;
  const v1::GenerateRequest r = chat_completion_request(body, &o);
  EXPECT_EQ(r.chat().messages(0).content(), "hi");
  EXPECT_FLOAT_EQ(r.sampling().temperature(), 0.25f);
  EXPECT_EQ(o.model, "m");
  const HttpError e = error_of([] { chat_completion_request(nlohmann::json::array(), nullptr); });
  EXPECT_EQ(e.status, 400);
}

TEST(ParseJsonBody, KeepsKeyOrderAndRefusesBadJson) {
  EXPECT_EQ(parse_json_body(R"({"b": 1, "a": 2})").dump(), R"({"b":1,"a":2})");
  const HttpError e = error_of([] { parse_json_body(R"({"a": )"); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.type, "invalid_request_error");
  EXPECT_TRUE(contains(e.what(), "not valid JSON")) << e.what();
  const HttpError u = error_of([] { parse_json_body("{\"a\": \"\xff\"}"); });
  EXPECT_EQ(u.status, 400);
}

// ---------------------------------------------------------------------------------------------
// Completion requests

TEST(CompletionRequest, PromptShapes) {
  const v1::GenerateRequest s = text_req(text());
  ASSERT_EQ(s.input_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(s.text(), "Once upon a time");

  const v1::GenerateRequest ids = text_req(parse(R"({"prompt": [1, 2, 151643]})"));
  ASSERT_EQ(ids.input_case(), v1::GenerateRequest::kTokens);
  ASSERT_EQ(ids.tokens().ids_size(), 3);
  EXPECT_EQ(ids.tokens().ids(2), 151643);

  const v1::GenerateRequest one = text_req(parse(R"({"prompt": ["only one"]})"));
  ASSERT_EQ(one.input_case(), v1::GenerateRequest::kText);
  EXPECT_EQ(one.text(), "only one");

  const v1::GenerateRequest nested = text_req(parse(R"({"prompt": [[5, 6]]})"));
  ASSERT_EQ(nested.input_case(), v1::GenerateRequest::kTokens);
  EXPECT_EQ(nested.tokens().ids_size(), 2);
}

TEST(CompletionRequest, PromptErrors) {
  expect_bad(text_req, parse("{}"), "prompt is required", "prompt");
  expect_bad(text_req, parse(R"({"prompt": null})"), "prompt is required", "prompt");
  expect_bad(text_req, parse(R"({"prompt": 5})"), "prompt must be a string, an array of token ids",
             "prompt");
  expect_bad(text_req, parse(R"({"prompt": []})"), "prompt is empty", "prompt");
  expect_bad(text_req, parse(R"({"prompt": ["a", "b"]})"),
             "only one prompt per request is supported", "prompt");
  expect_bad(text_req, parse(R"({"prompt": [[1], [2]]})"),
             "only one prompt per request is supported", "prompt");
  expect_bad(text_req, parse(R"({"prompt": [1, "a"]})"),
             "prompt[1] must be a token id (integer), not string", "prompt[1]");
  expect_bad(text_req, parse(R"({"prompt": [1.5]})"), "prompt[0] must be a token id (integer)",
             "prompt[0]");
  expect_bad(text_req, parse(R"({"prompt": [1099511627776]})"),
             "prompt[0] = 1099511627776 is out of range", "prompt[0]");
  expect_bad(text_req, parse(R"({"prompt": [[1, null]]})"),
             "prompt[0][1] must be a token id (integer), not null", "prompt[0][1]");
  expect_bad(text_req, parse(R"({"prompt": [{"a": 1}]})"),
             "prompt[0] must be a string or a token id", "prompt[0]");
  expect_bad(text_req, parse("[1]"), "the request body must be a JSON object", std::nullopt);
}

TEST(CompletionRequest, SamplingAndOptions) {
  OpenAiOptions o;
  const v1::GenerateRequest r = completion_request(
      text(R"("temperature": 0, "top_k": 1, "max_tokens": 16, "stop": "\n", "seed": 7,
             "stream": true, "stream_options": {"include_usage": true}, "model": "tiny",
             "echo": false, "best_of": 1, "logprobs": null, "suffix": "", "n": 1, "user": "x")"),
      &o);
  EXPECT_EQ(r.sampling().temperature(), 0.0f);
  EXPECT_TRUE(r.sampling().has_temperature());
  EXPECT_EQ(r.sampling().top_k(), 1);
  EXPECT_EQ(r.max_tokens(), 16);
  ASSERT_EQ(r.stop_size(), 1);
  EXPECT_EQ(r.stop(0), "\n");
  EXPECT_EQ(r.seed(), 7u);
  EXPECT_TRUE(o.stream);
  EXPECT_TRUE(o.include_usage);
  EXPECT_EQ(o.model, "tiny");
  expect_bad_text(R"("temperature": "hot")", "temperature must be a number, not string",
                  "temperature");
  expect_bad_text(R"("max_tokens": 0)", "max_tokens = 0 must be at least 1", "max_tokens");
}

TEST(CompletionRequest, UnsupportedFeaturesAreRefused) {
  expect_bad_text(R"("echo": true)", "echo is not supported", "echo");
  expect_bad_text(R"("echo": "yes")", "echo must be a boolean, not string", "echo");
  expect_bad_text(R"("best_of": 3)", "only best_of = 1 is supported", "best_of");
  expect_bad_text(R"("suffix": "end")", "suffix is not supported", "suffix");
  expect_bad_text(R"("n": 4)", "only n = 1 is supported", "n");
  EXPECT_EQ(text_req(text(R"("logprobs": false)")).text(), "Once upon a time");
}

// logit_bias: OpenAI's {"id": bias} and llama-server's [[id, bias]], false banning a token;
// anything else names the entry.
TEST(ChatRequest, LogitBiasInBothSpellings) {
  const v1::GenerateRequest a = chat_req(chat(R"("logit_bias": {"50256": -100, "7": 2.5})"));
  ASSERT_EQ(a.sampling().logit_bias_size(), 2);
  EXPECT_EQ(a.sampling().logit_bias().at(50256), -100.0f);
  EXPECT_EQ(a.sampling().logit_bias().at(7), 2.5f);
  const v1::GenerateRequest b = text_req(text(R"("logit_bias": [[3, 1.5], [9, false]])"));
  ASSERT_EQ(b.sampling().logit_bias_size(), 2);
  EXPECT_EQ(b.sampling().logit_bias().at(3), 1.5f);
  EXPECT_EQ(b.sampling().logit_bias().at(9), -INFINITY);
  expect_bad_chat(R"("logit_bias": {"-3": 1})", "'-3' is not a token id", "logit_bias[-3]");
  expect_bad_chat(R"("logit_bias": {"3": "a lot"})", "logit_bias[3] must be a number or false",
                  "logit_bias[3]");
  expect_bad_text(R"("logit_bias": [[3]])", "a [token id or text, bias] pair", "logit_bias[0]");
  expect_bad_text(R"("logit_bias": 5)", "logit_bias must be an object", "logit_bias");
}

// llama-server's logit_bias by text: keys that are not integers, or strings in the array form.
TEST(ChatRequest, LogitBiasByText) {
  const v1::GenerateRequest a = chat_req(chat(R"("logit_bias": {"hello": -1, "12": 3})"));
  EXPECT_EQ(a.sampling().logit_bias().at(12), 3.0f);
  EXPECT_EQ(a.sampling().logit_bias_text().at("hello"), -1.0f);
  const v1::GenerateRequest b = text_req(text(R"("logit_bias": [[" world", false], [4, 1]])"));
  EXPECT_EQ(b.sampling().logit_bias_text().at(" world"), -INFINITY);
  EXPECT_EQ(b.sampling().logit_bias().at(4), 1.0f);
  expect_bad_text(R"("logit_bias": [["", 1]])", "the text is empty", "logit_bias[0]");
  expect_bad_chat(R"("logit_bias": {")" + std::string(300, 'a') + R"(": 1})",
                  "longer than 256 bytes", "logit_bias[" + std::string(300, 'a') + "]");
}

TEST(ChatRequest, Logprobs) {
  const v1::GenerateRequest r = chat_req(chat(R"("logprobs": true, "top_logprobs": 5)"));
  EXPECT_TRUE(r.logprobs());
  EXPECT_EQ(r.top_logprobs(), 5);
  EXPECT_FALSE(chat_req(chat(R"("logprobs": false)")).logprobs());
  expect_bad_chat(R"("top_logprobs": 3)", "top_logprobs needs logprobs: true", "top_logprobs");
  expect_bad_chat(R"("logprobs": true, "top_logprobs": 21)", "outside 0..20", "top_logprobs");
  expect_bad_chat(R"("logprobs": 2)", "logprobs must be a boolean", "logprobs");
}

TEST(CompletionRequest, LogprobsIsHowManyAlternatives) {
  const v1::GenerateRequest r = text_req(text(R"("logprobs": 3)"));
  EXPECT_TRUE(r.logprobs());
  EXPECT_EQ(r.top_logprobs(), 3);
  const v1::GenerateRequest n = text_req(text(R"("n_probs": 2)"));
  EXPECT_EQ(n.top_logprobs(), 2);
  EXPECT_FALSE(text_req(text(R"("logprobs": false)")).logprobs());
  expect_bad_text(R"("logprobs": 30)", "outside 0..20", "logprobs");
}

// response_format (text, json_object with or without llama-server's schema, json_schema) and
// llama.cpp's json_schema and grammar keys: at most one of them.
TEST(ChatRequest, Constraints) {
  EXPECT_EQ(chat_req(chat(R"("response_format": {"type": "text"})")).constraint_case(),
            v1::GenerateRequest::CONSTRAINT_NOT_SET);
  EXPECT_TRUE(chat_req(chat(R"("response_format": {"type": "json_object"})")).json_object());
  const v1::GenerateRequest s = chat_req(chat(
      R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer"}}})"));
  EXPECT_EQ(nlohmann::json::parse(s.json_schema()), nlohmann::json::parse(R"({"type":"integer"})"));
  const v1::GenerateRequest o = chat_req(
      chat(R"("response_format": {"type": "json_object", "schema": {"type": "boolean"}})"));
  EXPECT_EQ(o.json_schema(), R"({"type":"boolean"})");
  EXPECT_EQ(chat_req(chat(R"("json_schema": {"type": "null"})")).json_schema(),
            R"({"type":"null"})");
  EXPECT_EQ(text_req(text(R"("grammar": "root ::= \"a\"")")).grammar(), "root ::= \"a\"");
  EXPECT_EQ(text_req(text(R"("grammar": "")")).constraint_case(),
            v1::GenerateRequest::CONSTRAINT_NOT_SET);
  expect_bad_chat(R"("response_format": {"type": "yaml"})",
                  "response_format type 'yaml' is not supported", "response_format.type");
  expect_bad_chat(R"("response_format": {"type": "json_schema"})",
                  "response_format.json_schema must be an object", "response_format.json_schema");
  expect_bad_chat(R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})",
                  "response_format.json_schema.schema is required",
                  "response_format.json_schema.schema");
  expect_bad_chat(R"("response_format": {"type": "json_object"}, "grammar": "root ::= \"a\"")",
                  "grammar and response_format cannot be combined", "grammar");
  expect_bad_text(R"("json_schema": {}, "grammar": "root ::= \"a\"")",
                  "grammar and json_schema cannot be combined", "grammar");
}

TEST(CompletionRequest, PlainJsonOverload) {
  const v1::GenerateRequest r =
      completion_request(nlohmann::json::parse(R"({"prompt": [3, 4]})"), nullptr);
  EXPECT_EQ(r.tokens().ids_size(), 2);
}

// ---------------------------------------------------------------------------------------------
// Errors

}  // namespace
}  // namespace moe::http
