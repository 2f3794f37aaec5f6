#include "coordinator/http/llama_routes.h"

#include <filesystem>
#include <span>
#include <vector>

#include "coordinator/chat_template/chat_template.h"
#include "coordinator/engine/slot_file.h"
#include "coordinator/http/openai_request.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "coordinator/tokenizer/utf8.h"

namespace moe::http {

namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& message, const std::string& param) {
  throw HttpError(400, message, param);
}

void require_object(const Json& body) {
  if (!body.is_object()) bad("the request body must be a JSON object", "");
}

bool optional_bool(const Json& body, const char* key, bool fallback) {
  const auto it = body.find(key);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) bad(std::string(key) + " must be a boolean", key);
  return it->get<bool>();
}

bool valid_utf8(const std::string& s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const tokenizer::Utf8Step st = tokenizer::scan_utf8(s, pos);
    if (st.kind != tokenizer::Utf8Step::kComplete) return false;
    pos += st.len;
  }
  return true;
}

}  // namespace

Json tokenize_body(const Json& body, const tokenizer::Tokenizer& tok) {
  require_object(body);
  const auto content = body.find("content");
  if (content == body.end() || !content->is_string()) bad("content must be a string", "content");
  const bool add_special = optional_bool(body, "add_special", false);
  const bool parse_special = optional_bool(body, "parse_special", true);
  const bool with_pieces = optional_bool(body, "with_pieces", false);
  std::vector<int32_t> ids;
  if (add_special && tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  const std::vector<int32_t> text =
      tok.encode(content->get_ref<const std::string&>(), parse_special);
  ids.insert(ids.end(), text.begin(), text.end());
  Json tokens = Json::array();
  for (int32_t id : ids) {
    if (!with_pieces) {
      tokens.push_back(id);
      continue;
    }
    const std::string piece = tok.token_piece(id, true);
    Json bytes = Json::array();
    if (!valid_utf8(piece)) {
      for (unsigned char c : piece) bytes.push_back(c);
    }
    tokens.push_back(Json{{"id", id}, {"piece", valid_utf8(piece) ? Json(piece) : bytes}});
  }
  return Json{{"tokens", std::move(tokens)}};
}

Json detokenize_body(const Json& body, const tokenizer::Tokenizer& tok) {
  require_object(body);
  const auto tokens = body.find("tokens");
  if (tokens == body.end() || !tokens->is_array()) bad("tokens must be an array", "tokens");
  std::vector<int32_t> ids;
  ids.reserve(tokens->size());
  for (size_t i = 0; i < tokens->size(); ++i) {
    const Json& t = (*tokens)[i];
    const std::string where = "tokens[" + std::to_string(i) + "]";
    if (!t.is_number_integer()) bad(where + " must be a token id", where);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= tok.n_vocab()) {
      bad(where + " = " + std::to_string(id) + " is not a token id (the vocabulary has " +
              std::to_string(tok.n_vocab()) + ")",
          where);
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  return Json{{"content", tok.decode(ids, /*remove_special=*/false, /*unparse_special=*/true)}};
}

Json apply_template_body(const Json& body, const server::ModelLimits& limits) {
  const v1::GenerateRequest req = chat_completion_request(body, nullptr);
  return Json{{"prompt", server::render_chat(req.chat(), limits, true)}};
}

Json props_body(const ServerFacts& facts, const server::ModelLimits& limits) {
  return Json{{"default_generation_settings", Json{{"n_ctx", facts.n_ctx}}},
              {"total_slots", facts.slots.size()},
              {"model_alias", facts.model_id},
              {"model_path", facts.model_path},
              {"chat_template", limits.chat_template ? limits.chat_template->source() : ""},
              {"modalities", Json{{"vision", false}, {"audio", false}}},
              {"kv_cache", facts.kv_cache},
              {"build_info", "moe-runtime"}};
}

Json slots_body(const ServerFacts& facts) {
  Json slots = Json::array();
  for (const engine::SlotStats& s : facts.slots) {
    slots.push_back(Json{
        {"id", s.id}, {"n_ctx", s.n_ctx}, {"is_processing", s.processing}, {"n_past", s.n_cached}});
  }
  return slots;
}

engine::SlotAction slot_action_request(const std::string& id, const std::string& action,
                                       std::string_view body, const std::string& save_dir) {
  // llama-server's answer too: the feature exists but this server was started without it, which
  // no change to the request can fix (501, not 400).
  if (save_dir.empty()) {
    throw HttpError(501, "this server was not started with --slot-save-path: slot actions are off");
  }
  engine::SlotAction a;
  if (id.empty() || id.size() > 6 || id.find_first_not_of("0123456789") != std::string::npos) {
    bad("the slot id in /slots/{id} must be a number, not '" + id.substr(0, 32) + "'", "id_slot");
  }
  a.slot = std::stoi(id);
  if (action == "erase") {
    a.kind = engine::SlotAction::Erase;
    return a;
  }
  if (action == "save") {
    a.kind = engine::SlotAction::Save;
  } else if (action == "restore") {
    a.kind = engine::SlotAction::Restore;
  } else {
    const std::string got =
        action.empty() ? " (?action=...)" : ", not '" + action.substr(0, 32) + "'";
    bad("action must be save, restore or erase" + got, "action");
  }
  const Json j = parse_json_body(body);
  require_object(j);
  const auto name = j.find("filename");
  if (name == j.end() || !name->is_string()) bad("filename must be a string", "filename");
  const std::string& filename = name->get_ref<const std::string&>();
  try {
    engine::check_slot_filename(filename);
  } catch (const engine::SlotFileError& e) {
    bad(e.what(), "filename");
  }
  a.path = std::filesystem::path(save_dir) / filename;
  return a;
}

Json slot_action_body(const engine::SlotAction& action, const engine::SlotActionResult& r) {
  using R = engine::SlotActionResult;
  switch (r.status) {
    case R::Ok:
      break;
    case R::BadRequest:
      throw HttpError(400, r.message);
    case R::NotFound:
      throw HttpError(404, r.message);
    case R::Busy:
      throw HttpError(409, r.message, std::nullopt, "conflict_error");
    case R::Unavailable:
      throw HttpError(503, r.message);
    case R::Failed:
      throw HttpError(500, r.message);
  }
  const std::string filename = action.path.filename().string();
  switch (action.kind) {
    case engine::SlotAction::Save:
      return Json{{"id_slot", action.slot},
                  {"filename", filename},
                  {"n_saved", r.n_tokens},
                  {"n_written", r.n_bytes},
                  {"timings", Json{{"save_ms", r.ms}}}};
    case engine::SlotAction::Restore:
      return Json{{"id_slot", action.slot},
                  {"filename", filename},
                  {"n_restored", r.n_tokens},
                  {"n_read", r.n_bytes},
                  {"timings", Json{{"restore_ms", r.ms}}}};
    case engine::SlotAction::Erase:
      break;
  }
  return Json{{"id_slot", action.slot}, {"n_erased", r.n_tokens}};
}

}  // namespace moe::http
