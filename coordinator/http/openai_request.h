// Translates OpenAI-compatible HTTP request bodies (POST /v1/chat/completions and /v1/completions,
// with llama-server's extensions) into the gRPC API's GenerateRequest. Only the HTTP side is
// checked here: JSON types, OpenAI shapes, and features this runtime does not have. Everything the
// gRPC API checks itself (empty input, UTF-8, roles, token ids, stop strings, sampler ranges,
// context size) is left to server::to_job_request(), which runs on the result.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "common/error.h"
#include "moe/v1/generation.pb.h"

namespace moe::http {

// OpenAI's / llama-server's error type for an HTTP status: 400 "invalid_request_error",
// 401 "authentication_error", 403 "permission_error", 404 "not_found_error", 413
// "invalid_request_error", 429 "rate_limit_error", 501 "not_supported_error", 503
// "unavailable_error", anything else "server_error".
std::string_view error_type_for_status(int status);

// An error answered with an HTTP status and an OpenAI error body (see error_body()).
class HttpError : public moe::Error {
 public:
  // An empty `type` is replaced by error_type_for_status(status). `param` names the request field
  // at fault ("temperature", "messages[2].content"), when there is one.
  HttpError(int status, const std::string& message, std::optional<std::string> param = std::nullopt,
            std::string type = {});

  int status;
  std::string type;
  std::optional<std::string> param;
};

// What the HTTP layer needs besides the GenerateRequest.
struct OpenAiOptions {
  bool stream = false;         // "stream": answer with server-sent events
  bool include_usage = false;  // "stream_options": {"include_usage": true}
  std::string model;           // "model" as sent ("" when absent); echoed in responses
};

// Parses a request body; invalid JSON (or invalid UTF-8) is a 400. ordered_json keeps the
// client's key order, which tool schemas and tool-call arguments reach the chat template with.
nlohmann::ordered_json parse_json_body(std::string_view body);

// POST /v1/chat/completions. `opts` may be null. Throws HttpError (400) naming the field at fault.
// Accepted: messages (role; content as a string, null, or an array of {"type":"text","text"}
// parts joined with "\n"; tool_calls; tool_call_id; name; reasoning_content; role "developer" is
// read as "system"), tools, tool_choice ("auto" or "none"; "none" leaves the tools out of the
// prompt), max_completion_tokens / max_tokens / n_predict (-1: no limit), temperature, top_p,
// top_k, min_p, typical_p, repeat_penalty, repeat_last_n, presence_penalty, frequency_penalty,
// top_n_sigma, xtc_probability, xtc_threshold, dry_multiplier, dry_base, dry_allowed_length,
// dry_penalty_last_n, min_keep, samplers, ignore_eos, stop, seed (-1: random), n (1 only), stream,
// stream_options.include_usage, chat_template_kwargs.enable_thinking, model. A null value is the
// same as an absent key. Other top-level keys are ignored, except features this runtime lacks
// when asked for (n > 1, logprobs, top_logprobs, response_format other than text, logit_bias,
// functions / function_call).
v1::GenerateRequest chat_completion_request(const nlohmann::ordered_json& body,
                                            OpenAiOptions* opts);
// The same for a body parsed into nlohmann::json (whose objects have sorted keys).
v1::GenerateRequest chat_completion_request(const nlohmann::json& body, OpenAiOptions* opts);

// POST /v1/completions: prompt (a string, an array of token ids, or an array with one string or
// one array of token ids) and the sampling keys above; echo, best_of > 1, logprobs, suffix,
// logit_bias and n > 1 are refused.
v1::GenerateRequest completion_request(const nlohmann::ordered_json& body, OpenAiOptions* opts);
v1::GenerateRequest completion_request(const nlohmann::json& body, OpenAiOptions* opts);

}  // namespace moe::http
