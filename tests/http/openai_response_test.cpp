// The OpenAI-compatible response shapes: errors, finish reasons, usage, completions, chunks and
// logprobs.
#include "coordinator/http/openai_response.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/http/openai_request.h"

namespace moe::http {
namespace {

using J = nlohmann::ordered_json;

TEST(HttpError, TypeFollowsStatus) {
  EXPECT_EQ(error_type_for_status(400), "invalid_request_error");
  EXPECT_EQ(error_type_for_status(401), "authentication_error");
  EXPECT_EQ(error_type_for_status(403), "permission_error");
  EXPECT_EQ(error_type_for_status(404), "not_found_error");
  EXPECT_EQ(error_type_for_status(413), "invalid_request_error");
  EXPECT_EQ(error_type_for_status(429), "rate_limit_error");
  EXPECT_EQ(error_type_for_status(500), "server_error");
  EXPECT_EQ(error_type_for_status(501), "not_supported_error");
  EXPECT_EQ(error_type_for_status(503), "unavailable_error");
  const HttpError e(401, "Invalid API Key");
  EXPECT_EQ(e.status, 401);
  EXPECT_EQ(e.type, "authentication_error");
  EXPECT_FALSE(e.param.has_value());
  EXPECT_STREQ(e.what(), "Invalid API Key");
  const HttpError c(400, "too long", "messages", "exceed_context_size_error");
  EXPECT_EQ(c.type, "exceed_context_size_error");
  EXPECT_EQ(c.param, "messages");
  // It is a moe::Error, so generic handlers catch it.
  EXPECT_THROW(throw HttpError(503, "busy"), moe::Error);
}

TEST(Response, ErrorBody) {
  EXPECT_EQ(
      error_body(HttpError(400, "temperature must be a number, not string", "temperature")).dump(),
      R"({"error":{"message":"temperature must be a number, not string",)"
      R"("type":"invalid_request_error","param":"temperature","code":400}})");
  EXPECT_EQ(error_body(HttpError(404, "File Not Found")).dump(),
            R"({"error":{"message":"File Not Found","type":"not_found_error","param":null,)"
            R"("code":404}})");
}

// ---------------------------------------------------------------------------------------------
// Responses

TEST(Response, FinishReasonName) {
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_EOG, false), "stop");
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_STOP_STRING, false), "stop");
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_EOG, true), "tool_calls");
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_STOP_STRING, true), "tool_calls");
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_LENGTH, false), "length");
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_LENGTH, true), "length");
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_CONTEXT, false), "length");
  EXPECT_EQ(finish_reason_name(v1::FINISH_REASON_UNSPECIFIED, false), "stop");
}

TEST(Response, UsageOfFinish) {
  v1::Finish f;
  f.set_prompt_tokens(12);
  f.set_completion_tokens(30);
  f.set_cached_tokens(9);
  const Usage u = usage_of(f);
  EXPECT_EQ(u.prompt_tokens, 12);
  EXPECT_EQ(u.completion_tokens, 30);
  EXPECT_EQ(u.cached_tokens, 9);
  EXPECT_EQ(usage_json(u).dump(), R"({"prompt_tokens":12,"completion_tokens":30,"total_tokens":42,)"
                                  R"("prompt_tokens_details":{"cached_tokens":9}})");
}

TEST(Response, ChatCompletionPlain) {
  ParsedDelta all;
  all.content = "Hello!";
  EXPECT_EQ(
      chat_completion("chatcmpl-1", 1700000000, "qwen3", all, "stop", {5, 2}).dump(),
      R"({"id":"chatcmpl-1","object":"chat.completion","created":1700000000,)"
      R"("model":"qwen3","choices":[{"index":0,"message":{"role":"assistant",)"
      R"("content":"Hello!"},"logprobs":null,"finish_reason":"stop"}],)"
      R"("usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}})");
}

TEST(Response, ChatCompletionWithReasoningAndToolCalls) {
  ParsedDelta all;
  all.reasoning = "Need the weather.";
  all.tool_calls.push_back({"call_a", "get_weather", R"({"city":"Paris"})"});
  all.tool_calls.push_back({"call_b", "get_time", "{}"});
  const J j = chat_completion("c", 1, "m", all, "tool_calls", {1, 1});
  const J& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg.dump(),
            R"({"role":"assistant","content":null,"reasoning_content":"Need the weather.",)"
            R"("tool_calls":[{"id":"call_a","type":"function","function":{"name":"get_weather",)"
            R"("arguments":"{\"city\":\"Paris\"}"}},{"id":"call_b","type":"function",)"
            R"("function":{"name":"get_time","arguments":"{}"}}]})");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");

  // Empty content without tool calls is "", not null.
  const J empty = chat_completion("c", 1, "m", ParsedDelta{}, "length", {1, 0});
  EXPECT_EQ(empty["choices"][0]["message"].dump(), R"({"role":"assistant","content":""})");
}

TEST(Response, ChatDelta) {
  EXPECT_EQ(chat_delta(ParsedDelta{}, true, 0).dump(), R"({"role":"assistant"})");
  EXPECT_EQ(chat_delta(ParsedDelta{}, false, 0).dump(), "{}");
  ParsedDelta d;
  d.content = "Hi";
  d.reasoning = "hmm";
  EXPECT_EQ(chat_delta(d, false, 0).dump(), R"({"content":"Hi","reasoning_content":"hmm"})");
  ParsedDelta calls;
  calls.tool_calls.push_back({"call_x", "f", R"({"a":1})"});
  calls.tool_calls.push_back({"call_y", "g", "{}"});
  EXPECT_EQ(chat_delta(calls, false, 2).dump(),
            R"({"tool_calls":[{"index":2,"id":"call_x","type":"function",)"
            R"("function":{"name":"f","arguments":"{\"a\":1}"}},)"
            R"({"index":3,"id":"call_y","type":"function","function":{"name":"g",)"
            R"("arguments":"{}"}}]})");
}

TEST(Response, ChatChunk) {
  ParsedDelta d;
  d.content = "Hel";
  EXPECT_EQ(chat_chunk("chatcmpl-9", 42, "qwen3", chat_delta(d, true, 0), std::nullopt).dump(),
            R"({"id":"chatcmpl-9","object":"chat.completion.chunk","created":42,)"
            R"("model":"qwen3","choices":[{"index":0,"delta":{"role":"assistant",)"
            R"("content":"Hel"},"logprobs":null,"finish_reason":null}]})");
  const J last = chat_chunk("chatcmpl-9", 42, "qwen3", J::object(), "stop", Usage{3, 4});
  EXPECT_EQ(last["choices"][0]["delta"].dump(), "{}");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["usage"]["total_tokens"], 7);
  EXPECT_FALSE(chat_chunk("i", 1, "m", J::object(), "stop").contains("usage"));
  EXPECT_EQ(
      chat_usage_chunk("chatcmpl-9", 42, "qwen3", {3, 4}).dump(),
      R"({"id":"chatcmpl-9","object":"chat.completion.chunk","created":42,)"
      R"("model":"qwen3","choices":[],)"
      R"("usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}})");
}

TEST(Response, TextCompletionAndChunks) {
  EXPECT_EQ(
      text_completion("cmpl-1", 7, "tiny", " there was", "length", {4, 3}).dump(),
      R"({"id":"cmpl-1","object":"text_completion","created":7,"model":"tiny",)"
      R"("choices":[{"text":" there was","index":0,"logprobs":null,)"
      R"("finish_reason":"length"}],)"
      R"("usage":{"prompt_tokens":4,"completion_tokens":3,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":0}}})");
  EXPECT_EQ(text_chunk("cmpl-1", 7, "tiny", " there", std::nullopt).dump(),
            R"({"id":"cmpl-1","object":"text_completion","created":7,"model":"tiny",)"
            R"("choices":[{"text":" there","index":0,"logprobs":null,"finish_reason":null}]})");
  const J last = text_chunk("cmpl-1", 7, "tiny", "", "stop", Usage{1, 2});
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(last["usage"]["completion_tokens"], 2);
  EXPECT_EQ(
      text_usage_chunk("cmpl-1", 7, "tiny", {1, 2}).dump(),
      R"({"id":"cmpl-1","object":"text_completion","created":7,"model":"tiny",)"
      R"("choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}})");
}

v1::TokenLogprobs logprobs_of(int32_t id, const std::string& piece, float lp,
                              std::vector<std::pair<std::string, float>> top) {
  v1::TokenLogprobs out;
  out.mutable_token()->set_id(id);
  out.mutable_token()->set_piece(piece);
  out.mutable_token()->set_logprob(lp);
  for (size_t i = 0; i < top.size(); ++i) {
    v1::TokenLogprob* t = out.add_top();
    t->set_id(static_cast<int32_t>(100 + i));
    t->set_piece(top[i].first);
    t->set_logprob(top[i].second);
  }
  return out;
}

TEST(Response, ChatLogprobs) {
  const std::vector<v1::TokenLogprobs> lps = {
      logprobs_of(7, "Hi", -0.5f, {{"Hi", -0.5f}, {"Yo", -1.0f}})};
  EXPECT_EQ(chat_logprobs(lps).dump(),
            R"({"content":[{"id":7,"token":"Hi","logprob":-0.5,"bytes":[72,105],"top_logprobs":[)"
            R"({"id":100,"token":"Hi","logprob":-0.5,"bytes":[72,105]},)"
            R"({"id":101,"token":"Yo","logprob":-1.0,"bytes":[89,111]}]}],"refusal":null})");
}

TEST(Response, TextLogprobsWithOffsets) {
  const std::vector<v1::TokenLogprobs> lps = {logprobs_of(1, "ab", -0.25f, {{"ab", -0.25f}}),
                                              logprobs_of(2, "c", -2.0f, {})};
  size_t offset = 5;
  EXPECT_EQ(
      text_logprobs(lps, offset).dump(),
      R"({"tokens":["ab","c"],"token_logprobs":[-0.25,-2.0],"top_logprobs":[{"ab":-0.25},{}],)"
      R"("text_offset":[5,7]})");
  EXPECT_EQ(offset, 8u);
}

TEST(Response, ModelsList) {
  EXPECT_EQ(models_list("tiny-qwen3moe", 1700000000).dump(),
            R"({"object":"list","data":[{"id":"tiny-qwen3moe","object":"model",)"
            R"("created":1700000000,"owned_by":"moe-runtime"}]})");
}

}  // namespace
}  // namespace moe::http
