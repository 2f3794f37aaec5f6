// The routes llama-server users script against, beside the OpenAI ones: POST /tokenize,
// /detokenize and /apply-template, GET /props and /slots, POST /slots/{id}, with llama-server's
// field names. Pure functions from a parsed body to the response body, so they are tested without
// a server; they throw HttpError (400) for a bad body.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
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

// POST /slots/{id}?action=save|restore|erase (llama-server's, with --slot-save-path DIR): the
// engine's action from the path's id, the query's action and the body ({"filename"} for save and
// restore: a bare name, engine::check_slot_filename), the file in `save_dir`. HttpError: 501
// without --slot-save-path, 400 for a bad id, action, body or name.
engine::SlotAction slot_action_request(const std::string& id, const std::string& action,
                                       std::string_view body, const std::string& save_dir);
// The engine's answer in llama-server's shape: {"id_slot", "filename", "n_saved", "n_written",
// "timings": {"save_ms"}}, the same with n_restored, n_read and restore_ms, or {"id_slot",
// "n_erased"}. HttpError for a failed action: 400, 404 (no such file), 409 (a busy slot), 503
// (stopping), 500 (the disk).
nlohmann::ordered_json slot_action_body(const engine::SlotAction& action,
                                        const engine::SlotActionResult& result);

}  // namespace moe::http
