#include "coordinator/http/openai_response.h"

#include <string>

namespace moe::http {

namespace {

using Json = nlohmann::ordered_json;

Json header(std::string_view id, std::string_view object, int64_t created, std::string_view model) {
  return Json{{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}

Json reason_or_null(std::optional<std::string_view> finish_reason) {
  return finish_reason ? Json(*finish_reason) : Json(nullptr);
}

}  // namespace

Usage usage_of(const v1::Finish& finish) {
  return Usage{finish.prompt_tokens(), finish.completion_tokens(), finish.cached_tokens()};
}

nlohmann::ordered_json usage_json(const Usage& usage) {
  return Json{{"prompt_tokens", usage.prompt_tokens},
              {"completion_tokens", usage.completion_tokens},
              {"total_tokens", usage.prompt_tokens + usage.completion_tokens},
              {"prompt_tokens_details", Json{{"cached_tokens", usage.cached_tokens}}}};
}

std::string_view finish_reason_name(v1::FinishReason reason, bool had_tool_calls) {
  switch (reason) {
    case v1::FINISH_REASON_LENGTH:
    case v1::FINISH_REASON_CONTEXT:
      return "length";
    default:  // EOG, STOP_STRING (and UNSPECIFIED)
      return had_tool_calls ? "tool_calls" : "stop";
  }
}

nlohmann::ordered_json tool_calls_json(const std::vector<ParsedToolCall>& calls,
                                       std::optional<size_t> first_index) {
  Json arr = Json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    const ParsedToolCall& c = calls[i];
    Json j = Json::object();
    if (first_index) j["index"] = *first_index + i;
    j["id"] = c.id;
    j["type"] = "function";
    j["function"] = Json{{"name", c.name}, {"arguments", c.arguments_json}};
    arr.push_back(std::move(j));
  }
  return arr;
}

nlohmann::ordered_json chat_completion(std::string_view id, int64_t created, std::string_view model,
                                       const ParsedDelta& all, std::string_view finish_reason,
                                       const Usage& usage) {
  Json message = {{"role", "assistant"}};
  message["content"] =
      all.content.empty() && !all.tool_calls.empty() ? Json(nullptr) : Json(all.content);
  if (!all.reasoning.empty()) message["reasoning_content"] = all.reasoning;
  if (!all.tool_calls.empty()) message["tool_calls"] = tool_calls_json(all.tool_calls);
  Json j = header(id, "chat.completion", created, model);
  j["choices"] = Json::array({Json{{"index", 0},
                                   {"message", std::move(message)},
                                   {"logprobs", nullptr},
                                   {"finish_reason", finish_reason}}});
  j["usage"] = usage_json(usage);
  return j;
}

nlohmann::ordered_json chat_delta(const ParsedDelta& delta, bool with_role,
                                  size_t first_tool_index) {
  Json d = Json::object();
  if (with_role) d["role"] = "assistant";
  if (!delta.content.empty()) d["content"] = delta.content;
  if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
  if (!delta.tool_calls.empty())
    d["tool_calls"] = tool_calls_json(delta.tool_calls, first_tool_index);
  return d;
}

nlohmann::ordered_json chat_chunk(std::string_view id, int64_t created, std::string_view model,
                                  const nlohmann::ordered_json& delta,
                                  std::optional<std::string_view> finish_reason,
                                  std::optional<Usage> usage) {
  Json j = header(id, "chat.completion.chunk", created, model);
  j["choices"] = Json::array({Json{{"index", 0},
                                   {"delta", delta},
                                   {"logprobs", nullptr},
                                   {"finish_reason", reason_or_null(finish_reason)}}});
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

nlohmann::ordered_json chat_usage_chunk(std::string_view id, int64_t created,
                                        std::string_view model, const Usage& usage) {
  Json j = header(id, "chat.completion.chunk", created, model);
  j["choices"] = Json::array();
  j["usage"] = usage_json(usage);
  return j;
}

nlohmann::ordered_json text_completion(std::string_view id, int64_t created, std::string_view model,
                                       std::string_view text, std::string_view finish_reason,
                                       const Usage& usage) {
  Json j = header(id, "text_completion", created, model);
  j["choices"] = Json::array({Json{
      {"text", text}, {"index", 0}, {"logprobs", nullptr}, {"finish_reason", finish_reason}}});
  j["usage"] = usage_json(usage);
  return j;
}

nlohmann::ordered_json text_chunk(std::string_view id, int64_t created, std::string_view model,
                                  std::string_view text,
                                  std::optional<std::string_view> finish_reason,
                                  std::optional<Usage> usage) {
  Json j = header(id, "text_completion", created, model);
  j["choices"] = Json::array({Json{{"text", text},
                                   {"index", 0},
                                   {"logprobs", nullptr},
                                   {"finish_reason", reason_or_null(finish_reason)}}});
  if (usage) j["usage"] = usage_json(*usage);
  return j;
}

nlohmann::ordered_json text_usage_chunk(std::string_view id, int64_t created,
                                        std::string_view model, const Usage& usage) {
  Json j = header(id, "text_completion", created, model);
  j["choices"] = Json::array();
  j["usage"] = usage_json(usage);
  return j;
}

namespace {

Json byte_list(const std::string& piece) {
  Json b = Json::array();
  for (unsigned char c : piece) b.push_back(static_cast<int>(c));
  return b;
}

Json entry(const v1::TokenLogprob& t) {
  // "id" is llama-server's addition, so a client can bias or ban exactly this token.
  return Json{{"id", t.id()},
              {"token", t.piece()},
              {"logprob", t.logprob()},
              {"bytes", byte_list(t.piece())}};
}

}  // namespace

nlohmann::ordered_json chat_logprobs(std::span<const v1::TokenLogprobs> lps) {
  Json content = Json::array();
  for (const v1::TokenLogprobs& lp : lps) {
    Json e = entry(lp.token());
    Json top = Json::array();
    for (const v1::TokenLogprob& t : lp.top()) top.push_back(entry(t));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return Json{{"content", std::move(content)}, {"refusal", nullptr}};
}

nlohmann::ordered_json text_logprobs(std::span<const v1::TokenLogprobs> lps, size_t& offset) {
  Json tokens = Json::array(), token_lps = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (const v1::TokenLogprobs& lp : lps) {
    tokens.push_back(lp.token().piece());
    token_lps.push_back(lp.token().logprob());
    Json top = Json::object();
    for (const v1::TokenLogprob& t : lp.top()) {
      if (!top.contains(t.piece())) top[t.piece()] = t.logprob();  // pieces may repeat
    }
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += lp.token().piece().size();
  }
  return Json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

nlohmann::ordered_json error_body(const HttpError& e) {
  return Json{{"error",
               {{"message", e.what()},
                {"type", e.type},
                {"param", e.param ? Json(*e.param) : Json(nullptr)},
                {"code", e.status}}}};
}

nlohmann::ordered_json models_list(std::string_view model_id, int64_t created) {
  return Json{{"object", "list"},
              {"data", Json::array({Json{{"id", model_id},
                                         {"object", "model"},
                                         {"created", created},
                                         {"owned_by", "moe-runtime"}}})}};
}

}  // namespace moe::http
