// The routes llama-server users script against, beside the OpenAI ones: POST /tokenize,
// /detokenize and /apply-template, GET /props and /slots, with llama-server's field names. Pure
// functions from a parsed body to the response body, so they are tested without a server; they
// throw HttpError (400) for a bad body.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "coordinator/engine/engine.h"
#include "coordinator/server/request_validation.h"

namespace moe::http {

// {"content", "add_special"?, "parse_special"?, "with_pieces"?} -> {"tokens": [id] or
// [{"id", "piece"}]} (a piece that is not valid UTF-8 on its own comes as its bytes).
nlohmann::ordered_json tokenize_body(const nlohmann::ordered_json& body,
                                     const tokenizer::Tokenizer& tok);
// {"tokens": [id]} -> {"content"}.
nlohmann::ordered_json detokenize_body(const nlohmann::ordered_json& body,
                                       const tokenizer::Tokenizer& tok);
// A chat completion body -> {"prompt"}: the model's template applied as for a completion.
nlohmann::ordered_json apply_template_body(const nlohmann::ordered_json& body,
                                           const server::ModelLimits& limits);

struct ServerFacts {
  std::string model_id, model_path;
  int64_t n_ctx = 0;
  std::vector<engine::SlotStats> slots;  // -np of them
  std::string kv_cache;                  // types by layer, rotation, bytes
};
nlohmann::ordered_json props_body(const ServerFacts& facts, const server::ModelLimits& limits);
nlohmann::ordered_json slots_body(const ServerFacts& facts);

}  // namespace moe::http
