#include "coordinator/server/request_validation.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/bounded_json.h"
#include "coordinator/sampling/sampler.h"
#include "coordinator/sampling/sampler_params.h"
#include "coordinator/server/request_grammar.h"
#include "coordinator/tokenizer/utf8.h"

namespace moe::server {

namespace {

constexpr size_t kMaxStopStrings = 16;
constexpr size_t kMaxStopBytes = 1024;

// proto3 keeps fields it does not know; in a chat message they are a client's mistake (a
// misspelled or newer field) that would otherwise be dropped silently.
void require_known_fields(const google::protobuf::Message& m, const std::string& where) {
  const auto& unknown = m.GetReflection()->GetUnknownFields(m);
  if (unknown.field_count() > 0) {
    throw BadRequest(where + " has an unknown field (number " +
                     std::to_string(unknown.field(0).number()) + ")");
  }
}

nlohmann::ordered_json parse_json_object(const std::string& text, const std::string& field) {
  require_utf8(text, field);
  nlohmann::ordered_json j;
  try {
    j = parse_bounded_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw BadRequest(field + " is not valid JSON: " + e.what());
  } catch (const JsonLimitError& e) {
    throw BadRequest(field + " is refused: " + e.what());
  }
  if (!j.is_object()) throw BadRequest(field + " must be a JSON object");
  return j;
}

void apply_sampling(const v1::SamplingParams& s, sampling::SamplingParams& p) {
  if (s.has_temperature()) p.temp = s.temperature();
  if (s.has_top_k()) p.top_k = s.top_k();
  if (s.has_top_p()) p.top_p = s.top_p();
  if (s.has_min_p()) p.min_p = s.min_p();
  if (s.has_typical_p()) p.typical_p = s.typical_p();
  if (s.has_repeat_penalty()) p.repeat_penalty = s.repeat_penalty();
  if (s.has_repeat_last_n()) p.repeat_last_n = s.repeat_last_n();
  if (s.has_presence_penalty()) p.presence_penalty = s.presence_penalty();
  if (s.has_frequency_penalty()) p.frequency_penalty = s.frequency_penalty();
  if (s.has_top_n_sigma()) p.top_n_sigma = s.top_n_sigma();
  if (s.has_xtc_probability()) p.xtc_probability = s.xtc_probability();
  if (s.has_xtc_threshold()) p.xtc_threshold = s.xtc_threshold();
  if (s.has_dry_multiplier()) p.dry_multiplier = s.dry_multiplier();
  if (s.has_dry_base()) p.dry_base = s.dry_base();
  if (s.has_dry_allowed_length()) p.dry_allowed_length = s.dry_allowed_length();
  if (s.has_dry_penalty_last_n()) p.dry_penalty_last_n = s.dry_penalty_last_n();
  if (s.has_min_keep()) p.min_keep = s.min_keep();
  if (s.has_samplers()) p.order = sampling::parse_sampler_order(s.samplers());
  if (s.logit_bias_size() > 0) {
    if (static_cast<size_t>(s.logit_bias_size()) > sampling::kMaxLogitBias) {
      throw BadRequest("sampling.logit_bias has " + std::to_string(s.logit_bias_size()) +
                       " entries, more than " + std::to_string(sampling::kMaxLogitBias));
    }
    p.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
    std::sort(p.logit_bias.begin(), p.logit_bias.end());  // a map's order is unspecified
  }
}

// llama-server's logit_bias by text: the bias goes to each token of the text.
void apply_bias_texts(const v1::SamplingParams& s, const tokenizer::Tokenizer& tok,
                      sampling::SamplingParams& p) {
  if (s.logit_bias_text_size() == 0) return;
  if (static_cast<size_t>(s.logit_bias_size() + s.logit_bias_text_size()) >
      sampling::kMaxLogitBias) {
    throw BadRequest("sampling.logit_bias has more than " +
                     std::to_string(sampling::kMaxLogitBias) + " entries");
  }
  for (const auto& [text, bias] : s.logit_bias_text()) {
    if (text.empty() || text.size() > 256) {
      throw BadRequest("sampling.logit_bias_text: a text must have 1 to 256 bytes");
    }
    require_utf8(text, "sampling.logit_bias_text");
    for (int32_t id : tok.encode(text, /*parse_special=*/false))
      p.logit_bias.emplace_back(id, bias);
  }
  std::sort(p.logit_bias.begin(), p.logit_bias.end());
}

}  // namespace

void require_utf8(const std::string& text, const std::string& field) {
  size_t pos = 0;
  while (pos < text.size()) {
    const tokenizer::Utf8Step st = tokenizer::scan_utf8(text, pos);
    if (st.kind != tokenizer::Utf8Step::kComplete) {
      throw BadRequest(field + " is not valid UTF-8 (byte " + std::to_string(pos) + ")");
    }
    pos += st.len;
  }
}

ChatTemplateInputs chat_inputs(const v1::ChatInput& chat, const ModelLimits& m,
                               bool default_generation_prompt) {
  if (m.chat_template == nullptr) {
    throw BadRequest("this model has no chat template (tokenizer.chat_template); send text");
  }
  if (chat.messages_size() == 0) throw BadRequest("chat.messages is empty");
  require_known_fields(chat, "chat");
  ChatTemplateInputs in;
  in.messages = nlohmann::ordered_json::array();
  for (int i = 0; i < chat.messages_size(); ++i) {
    const v1::ChatMessage& msg = chat.messages(i);
    const std::string where = "chat.messages[" + std::to_string(i) + "]";
    require_known_fields(msg, where);
    const std::string& role = msg.role();
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      throw BadRequest(where + ".role '" + role + "' is not one of system, user, assistant, tool");
    }
    require_utf8(msg.content(), where + ".content");
    nlohmann::ordered_json j = {{"role", role}, {"content", msg.content()}};
    if (!msg.reasoning_content().empty()) {
      if (role != "assistant") throw BadRequest(where + ".reasoning_content is for assistants");
      require_utf8(msg.reasoning_content(), where + ".reasoning_content");
      j["reasoning_content"] = msg.reasoning_content();
    }
    if (msg.tool_calls_size() > 0) {
      if (role != "assistant") throw BadRequest(where + ".tool_calls is for assistants");
      auto calls = nlohmann::ordered_json::array();
      for (int k = 0; k < msg.tool_calls_size(); ++k) {
        const v1::ToolCall& c = msg.tool_calls(k);
        const std::string cw = where + ".tool_calls[" + std::to_string(k) + "]";
        require_known_fields(c, cw);
        if (c.name().empty()) throw BadRequest(cw + ".name is empty");
        nlohmann::ordered_json call = {
            {"type", "function"},
            {"function",
             {{"name", c.name()},
              {"arguments", parse_json_object(c.arguments_json(), cw + ".arguments_json")}}}};
        if (!c.id().empty()) call["id"] = c.id();
        calls.push_back(std::move(call));
      }
      j["tool_calls"] = std::move(calls);
    }
    if (!msg.tool_call_id().empty()) j["tool_call_id"] = msg.tool_call_id();
    if (!msg.name().empty()) j["name"] = msg.name();
    in.messages.push_back(std::move(j));
  }
  if (chat.tool_choice().size() > 256) throw BadRequest("chat.tool_choice is over 256 bytes");
  require_utf8(chat.tool_choice(), "chat.tool_choice");
  // "none": the model is not shown the tools, so it cannot call one.
  if (chat.tools_json_size() > 0 && chat.tool_choice() != "none") {
    in.tools = nlohmann::ordered_json::array();
    for (int i = 0; i < chat.tools_json_size(); ++i) {
      in.tools.push_back(
          parse_json_object(chat.tools_json(i), "chat.tools_json[" + std::to_string(i) + "]"));
    }
  }
  in.add_generation_prompt =
      chat.has_add_generation_prompt() ? chat.add_generation_prompt() : default_generation_prompt;
  if (chat.has_enable_thinking()) in.enable_thinking = chat.enable_thinking();
  if (!chat.template_vars_json().empty()) {
    if (chat.template_vars_json().size() > 16384) {
      throw BadRequest("chat.template_vars_json is over 16 KiB");
    }
    // The template refuses names the request sets itself (ChatTemplate::render).
    in.extra = parse_json_object(chat.template_vars_json(), "chat.template_vars_json");
  }
  const tokenizer::Tokenizer& tok = *m.tok;
  if (tok.bos_id() >= 0) in.bos_token = std::string(tok.vocab().text(tok.bos_id()));
  if (tok.eos_id() >= 0) in.eos_token = std::string(tok.vocab().text(tok.eos_id()));
  return in;
}

std::string render_chat(const v1::ChatInput& chat, const ModelLimits& m,
                        bool default_generation_prompt) {
  const ChatTemplateInputs in = chat_inputs(chat, m, default_generation_prompt);
  try {
    return m.chat_template->render(in);
  } catch (const moe::Error& e) {
    // The template itself rejects some inputs (raise_exception), e.g. a misplaced system message.
    throw BadRequest(std::string("chat template: ") + e.what());
  }
}

std::vector<int32_t> tokenize_prompt(const std::string& text, const tokenizer::Tokenizer& tok) {
  std::vector<int32_t> ids;
  if (tok.add_bos() && tok.bos_id() >= 0) ids.push_back(tok.bos_id());
  const std::vector<int32_t> body = tok.encode(text, /*parse_special=*/true);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

engine::JobRequest to_job_request(const v1::GenerateRequest& req, const ModelLimits& m) {
  const tokenizer::Tokenizer& tok = *m.tok;
  engine::JobRequest out;
  ThinkMode think = ThinkMode::None;
  switch (req.input_case()) {
    case v1::GenerateRequest::kText:
      if (req.text().empty()) throw BadRequest("text is empty");
      require_utf8(req.text(), "text");
      out.prompt = tokenize_prompt(req.text(), tok);
      break;
    case v1::GenerateRequest::kTokens: {
      const auto& ids = req.tokens().ids();
      if (ids.empty()) throw BadRequest("tokens.ids is empty");
      for (int i = 0; i < ids.size(); ++i) {
        if (ids[i] < 0 || ids[i] >= tok.n_vocab()) {
          throw BadRequest("tokens.ids[" + std::to_string(i) + "] = " + std::to_string(ids[i]) +
                           " is not a token id (the vocabulary has " +
                           std::to_string(tok.n_vocab()) + ")");
        }
      }
      out.prompt.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kChat: {
      const std::string text = render_chat(req.chat(), m, true);
      out.prompt = tokenize_prompt(text, tok);
      think = think_mode(text, true);
      break;
    }
    default:
      throw BadRequest("the request has no input: set text, tokens or chat");
  }
  if (out.prompt.empty()) throw BadRequest("the prompt has no tokens");
  const auto n_prompt = static_cast<int64_t>(out.prompt.size());
  if (n_prompt >= m.n_ctx) {
    throw BadRequest("the prompt has " + std::to_string(n_prompt) + " tokens; the context holds " +
                     std::to_string(m.n_ctx) + " (prompt plus at least one generated token)");
  }
  if (req.max_tokens() < 0) {
    throw BadRequest("max_tokens = " + std::to_string(req.max_tokens()) + " is negative");
  }
  out.max_tokens = req.max_tokens() > 0 ? req.max_tokens() : m.default_max_tokens;
  if (static_cast<size_t>(req.stop_size()) > kMaxStopStrings) {
    throw BadRequest("at most " + std::to_string(kMaxStopStrings) + " stop strings");
  }
  for (int i = 0; i < req.stop_size(); ++i) {
    const std::string where = "stop[" + std::to_string(i) + "]";
    if (req.stop(i).empty()) throw BadRequest(where + " is empty");
    if (req.stop(i).size() > kMaxStopBytes) {
      throw BadRequest(where + " is longer than " + std::to_string(kMaxStopBytes) + " bytes");
    }
    require_utf8(req.stop(i), where);
    out.stop.push_back(req.stop(i));
  }
  out.ignore_eos = req.ignore_eos();
  out.cache_prompt = !req.has_cache_prompt() || req.cache_prompt();
  if (req.has_n_keep() && req.n_keep() < -1) {
    throw BadRequest("n_keep = " + std::to_string(req.n_keep()) +
                     " must be -1 (the whole prompt) or more");
  }
  out.n_keep = req.has_n_keep() ? req.n_keep() : 0;
  if (req.top_logprobs() < 0 || req.top_logprobs() > sampling::Sampler::kMaxTopLogprobs) {
    throw BadRequest("top_logprobs = " + std::to_string(req.top_logprobs()) + " is outside 0.." +
                     std::to_string(sampling::Sampler::kMaxTopLogprobs));
  }
  if (req.top_logprobs() > 0 && !req.logprobs()) {
    throw BadRequest("top_logprobs needs logprobs = true");
  }
  out.top_logprobs = req.logprobs() ? req.top_logprobs() : -1;
  out.grammar = request_grammar(req, think);
  try {
    v1::SamplingParams merged;
    if (m.default_sampling != nullptr) merged = *m.default_sampling;
    merged.MergeFrom(req.sampling());  // the request's own settings win
    apply_sampling(merged, out.sampling);
    apply_bias_texts(merged, tok, out.sampling);
    out.sampling.seed = req.has_seed()   ? req.seed()
                        : m.default_seed ? *m.default_seed
                                         : sampling::kRandomSeed;
    out.sampling.validate();
    for (const auto& [id, bias] : out.sampling.logit_bias) {
      if (m.tok != nullptr && id >= m.tok->n_vocab()) {
        throw moe::Error("sampling: logit_bias token id " + std::to_string(id) +
                         " is outside the vocabulary (" + std::to_string(m.tok->n_vocab()) +
                         " tokens)");
      }
    }
  } catch (const moe::Error& e) {
    // The sampler's messages already start with "sampling: ".
    const std::string what = e.what();
    throw BadRequest(what.rfind("sampling: ", 0) == 0 ? what : "sampling: " + what);
  }
  return out;
}

v1::TokenLogprobs logprobs_to_proto(const sampling::Logprobs& lp, const tokenizer::Tokenizer& tok) {
  v1::TokenLogprobs out;
  auto fill = [&](const sampling::TokenLogprob& t, v1::TokenLogprob& p) {
    p.set_id(t.id);
    p.set_piece(tok.token_piece(t.id, true));
    p.set_logprob(t.logprob);
  };
  fill(lp.token, *out.mutable_token());
  for (const sampling::TokenLogprob& t : lp.top) fill(t, *out.add_top());
  return out;
}

v1::FinishReason finish_reason_to_proto(engine::FinishReason r) {
  switch (r) {
    case engine::FinishReason::Eog:
      return v1::FINISH_REASON_EOG;
    case engine::FinishReason::Length:
      return v1::FINISH_REASON_LENGTH;
    case engine::FinishReason::StopString:
      return v1::FINISH_REASON_STOP_STRING;
    case engine::FinishReason::Context:
      return v1::FINISH_REASON_CONTEXT;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

}  // namespace moe::server
