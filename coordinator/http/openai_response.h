// OpenAI-compatible response bodies (the shapes llama-server answers with): chat completions and
// their streamed chunks, text completions and their chunks, error bodies and the model list. Each
// builder returns an ordered_json with OpenAI's key order; the caller serializes it (for SSE:
// "data: " + dump() + "\n\n", then "data: [DONE]\n\n").
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "coordinator/http/openai_request.h"
#include "coordinator/http/qwen_output_parser.h"
#include "moe/v1/generation.pb.h"

namespace moe::http {

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // of prompt_tokens, from the prompt cache
};

// The token counts of a finished generation.
Usage usage_of(const v1::Finish& finish);

// {"prompt_tokens", "completion_tokens", "total_tokens"}.
nlohmann::ordered_json usage_json(const Usage& usage);

// "stop" for EOG and STOP_STRING ("tool_calls" when the reply made tool calls), "length" for
// LENGTH and CONTEXT; an unspecified reason reads as "stop".
std::string_view finish_reason_name(v1::FinishReason reason, bool had_tool_calls);

// The "tool_calls" array of a message, or of a streamed delta when `first_index` is set: OpenAI's
// streaming shape, each call with its "index" (its position in the whole reply), first_index +
// its position in `calls`.
nlohmann::ordered_json tool_calls_json(const std::vector<ParsedToolCall>& calls,
                                       std::optional<size_t> first_index = std::nullopt);

// Non-streaming POST /v1/chat/completions:
// {"id", "object": "chat.completion", "created", "model", "choices": [{"index": 0, "message":
// {"role": "assistant", "content", "reasoning_content" (when non-empty), "tool_calls" (when any)},
// "logprobs": null, "finish_reason"}], "usage"}. "content" is null when it is empty and there are
// tool calls.
nlohmann::ordered_json chat_completion(std::string_view id, int64_t created, std::string_view model,
                                       const ParsedDelta& all, std::string_view finish_reason,
                                       const Usage& usage);

// The "delta" of a streamed chat chunk: "role": "assistant" when `with_role` (the first chunk),
// then "content", "reasoning_content" and "tool_calls" for those that are non-empty. Tool calls
// are numbered from `first_tool_index` (the number of tool calls already streamed). An empty
// delta is {} (as in the chunk carrying the finish reason).
nlohmann::ordered_json chat_delta(const ParsedDelta& delta, bool with_role,
                                  size_t first_tool_index);

// One streamed chunk: {"id", "object": "chat.completion.chunk", "created", "model", "choices":
// [{"index": 0, "delta", "logprobs": null, "finish_reason": finish_reason or null}], "usage"
// (only when given)}.
nlohmann::ordered_json chat_chunk(std::string_view id, int64_t created, std::string_view model,
                                  const nlohmann::ordered_json& delta,
                                  std::optional<std::string_view> finish_reason,
                                  std::optional<Usage> usage = std::nullopt);

// The extra last chunk of stream_options.include_usage: "choices": [] and "usage".
nlohmann::ordered_json chat_usage_chunk(std::string_view id, int64_t created,
                                        std::string_view model, const Usage& usage);

// Non-streaming POST /v1/completions: {"id", "object": "text_completion", "created", "model",
// "choices": [{"text", "index": 0, "logprobs": null, "finish_reason"}], "usage"}.
nlohmann::ordered_json text_completion(std::string_view id, int64_t created, std::string_view model,
                                       std::string_view text, std::string_view finish_reason,
                                       const Usage& usage);

// One streamed /v1/completions chunk (same shape, "finish_reason" null until the last).
nlohmann::ordered_json text_chunk(std::string_view id, int64_t created, std::string_view model,
                                  std::string_view text,
                                  std::optional<std::string_view> finish_reason,
                                  std::optional<Usage> usage = std::nullopt);

// The extra last chunk of stream_options.include_usage for /v1/completions.
nlohmann::ordered_json text_usage_chunk(std::string_view id, int64_t created,
                                        std::string_view model, const Usage& usage);

// {"error": {"message", "type", "param" (null when none), "code" (the HTTP status, as
// llama-server sends it)}}.
// OpenAI's chat logprobs object, {"content": [{token, logprob, bytes, top_logprobs}, ...]}, for
// these tokens (a response's or one chunk's).
nlohmann::ordered_json chat_logprobs(std::span<const v1::TokenLogprobs> lps);

// The completions API's logprobs object, {"tokens", "token_logprobs", "top_logprobs",
// "text_offset"}; `offset` is the first token's byte offset in the completion and is advanced
// past these tokens.
nlohmann::ordered_json text_logprobs(std::span<const v1::TokenLogprobs> lps, size_t& offset);

nlohmann::ordered_json error_body(const HttpError& e);

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created",
// "owned_by": "moe-runtime"}]}.
nlohmann::ordered_json models_list(std::string_view model_id, int64_t created);

}  // namespace moe::http
