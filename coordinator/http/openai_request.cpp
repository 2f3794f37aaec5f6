#include "coordinator/http/openai_request.h"

#include <algorithm>
#include <cctype>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "common/bounded_json.h"
#include "coordinator/sampling/sampler_params.h"

namespace moe::http {

namespace {

using Json = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& message, const std::string& param) {
  throw HttpError(400, message, param);
}

// The value of `key`, or null when it is absent or JSON null (clients send both for "unset").
const Json* find(const Json& obj, const char* key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

std::string not_a(const std::string& name, const char* what, const Json& v) {
  return name + " must be " + what + ", not " + v.type_name();
}

bool get_bool(const Json& v, const std::string& name) {
  if (!v.is_boolean()) bad(not_a(name, "a boolean", v), name);
  return v.get<bool>();
}

const std::string& get_string(const Json& v, const std::string& name) {
  if (!v.is_string()) bad(not_a(name, "a string", v), name);
  return v.get_ref<const std::string&>();
}

double get_number(const Json& v, const std::string& name) {
  if (!v.is_number()) bad(not_a(name, "a number", v), name);
  return v.get<double>();
}

float get_float(const Json& v, const std::string& name) {
  const double d = get_number(v, name);
  if (!(std::fabs(d) <= static_cast<double>(FLT_MAX))) {
    bad(name + " = " + v.dump() + " is out of range", name);
  }
  return static_cast<float>(d);
}

// An integer (an integral float such as 5.0 is accepted, as llama-server does), clamped to the
// int64 range.
int64_t get_integer(const Json& v, const std::string& name) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? INT64_MAX : static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
      return static_cast<int64_t>(d);
    }
  }
  bad(not_a(name, "an integer", v), name);
}

int32_t get_int32(const Json& v, const std::string& name) {
  const int64_t i = get_integer(v, name);
  if (i < INT32_MIN || i > INT32_MAX) bad(name + " = " + v.dump() + " is out of range", name);
  return static_cast<int32_t>(i);
}

struct FloatKey {
  const char* name;
  void (v1::SamplingParams::*set)(float);
};
struct IntKey {
  const char* name;
  void (v1::SamplingParams::*set)(int32_t);
};

constexpr FloatKey kFloatKeys[] = {
    {"temperature", &v1::SamplingParams::set_temperature},
    {"top_p", &v1::SamplingParams::set_top_p},
    {"min_p", &v1::SamplingParams::set_min_p},
    {"typical_p", &v1::SamplingParams::set_typical_p},
    {"repeat_penalty", &v1::SamplingParams::set_repeat_penalty},
    {"presence_penalty", &v1::SamplingParams::set_presence_penalty},
    {"frequency_penalty", &v1::SamplingParams::set_frequency_penalty},
    {"top_n_sigma", &v1::SamplingParams::set_top_n_sigma},
    {"xtc_probability", &v1::SamplingParams::set_xtc_probability},
    {"xtc_threshold", &v1::SamplingParams::set_xtc_threshold},
    {"dry_multiplier", &v1::SamplingParams::set_dry_multiplier},
    {"dry_base", &v1::SamplingParams::set_dry_base},
};
constexpr IntKey kIntKeys[] = {
    {"top_k", &v1::SamplingParams::set_top_k},
    {"repeat_last_n", &v1::SamplingParams::set_repeat_last_n},
    {"dry_allowed_length", &v1::SamplingParams::set_dry_allowed_length},
    {"dry_penalty_last_n", &v1::SamplingParams::set_dry_penalty_last_n},
    {"min_keep", &v1::SamplingParams::set_min_keep},
};

// max_tokens and its aliases: -1 (llama-server's "no limit") becomes 0, the gRPC API's.
void read_max_tokens(const Json& body, v1::GenerateRequest& req) {
  for (const char* key : {"max_completion_tokens", "max_tokens", "n_predict"}) {
    const Json* v = find(body, key);
    if (v == nullptr) continue;
    const int64_t n = get_integer(*v, key);
    if (n == -1) {
      req.set_max_tokens(0);
    } else if (n < 1) {
      bad(std::string(key) + " = " + v->dump() + " must be at least 1 (or -1 for no limit)", key);
    } else {
      req.set_max_tokens(n > INT32_MAX ? INT32_MAX : static_cast<int32_t>(n));
    }
    return;  // the first present key wins (max_completion_tokens replaces max_tokens)
  }
}

void read_stop(const Json& body, v1::GenerateRequest& req) {
  const Json* v = find(body, "stop");
  if (v == nullptr) return;
  if (v->is_string()) {
    req.add_stop(v->get<std::string>());
    return;
  }
  if (!v->is_array()) bad(not_a("stop", "a string or an array of strings", *v), "stop");
  for (size_t i = 0; i < v->size(); ++i) {
    const std::string name = "stop[" + std::to_string(i) + "]";
    req.add_stop(get_string((*v)[i], name));
  }
}

// logit_bias as OpenAI sends it, {"token id": bias}, or as llama-server also takes it,
// [[id, bias], ...]; a bias of false bans the token (-inf). Bounded before it is walked.
void read_logit_bias(const Json& v, google::protobuf::Map<int32_t, float>& out,
                     google::protobuf::Map<std::string, float>& texts) {
  if (!v.is_object() && !v.is_array()) {
    bad(not_a("logit_bias", "an object of token id -> bias", v), "logit_bias");
  }
  if (v.size() > sampling::kMaxLogitBias) {
    bad("logit_bias has " + std::to_string(v.size()) + " entries, more than " +
            std::to_string(sampling::kMaxLogitBias),
        "logit_bias");
  }
  const auto bias_of = [](const Json& b, const std::string& field) {
    if (b.is_boolean() && !b.get<bool>()) return -INFINITY;
    if (!b.is_number()) bad(not_a(field, "a number or false", b), field);
    return b.get<float>();
  };
  // A key that is all digits is a token id; any other key is text whose tokens get the bias.
  const auto put = [&](const std::string& key, float bias, const std::string& field) {
    const size_t sign = !key.empty() && key[0] == '-' ? 1 : 0;
    const bool digits =
        key.size() > sign && key.find_first_not_of("0123456789", sign) == std::string::npos;
    if (!digits) {
      if (key.size() > 256) bad(field + ": the text is longer than 256 bytes", field);
      texts[key] = bias;
      return;
    }
    size_t used = 0;
    long long id = -1;
    try {
      id = std::stoll(key, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != key.size() || id < 0 || id > INT32_MAX) {
      bad(field + ": '" + key + "' is not a token id", field);
    }
    out[static_cast<int32_t>(id)] = bias;
  };
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string field = "logit_bias[" + it.key() + "]";
      put(it.key(), bias_of(it.value(), field), field);
    }
    return;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string field = "logit_bias[" + std::to_string(i) + "]";
    const Json& e = v[i];
    if (!e.is_array() || e.size() != 2 || !(e[0].is_number_integer() || e[0].is_string())) {
      bad(not_a(field, "a [token id or text, bias] pair", e), field);
    }
    if (e[0].is_string()) {
      const std::string& text = e[0].get_ref<const std::string&>();
      if (text.empty()) bad(field + ": the text is empty", field);
      if (text.size() > 256) bad(field + ": the text is longer than 256 bytes", field);
      texts[text] = bias_of(e[1], field);
    } else {
      const int64_t id = e[0].get<int64_t>();
      if (id < 0 || id > INT32_MAX) bad(field + ": " + e[0].dump() + " is not a token id", field);
      out[static_cast<int32_t>(id)] = bias_of(e[1], field);
    }
  }
}

// Constrained output: OpenAI's response_format (text, json_object, json_schema; llama-server's
// json_object with a "schema"), and llama.cpp's top-level json_schema and grammar. At most one.
void read_constraint(const Json& body, v1::GenerateRequest& req) {
  std::string set_by;
  const auto claim = [&](const std::string& key) {
    if (!set_by.empty()) bad(key + " and " + set_by + " cannot be combined", key);
    set_by = key;
  };
  if (const Json* v = find(body, "response_format")) {
    if (!v->is_object()) bad(not_a("response_format", "an object", *v), "response_format");
    const Json* type = find(*v, "type");
    if (type == nullptr) bad("response_format.type is required", "response_format.type");
    const std::string& t = get_string(*type, "response_format.type");
    if (t == "json_schema") {
      const Json* js = find(*v, "json_schema");
      if (js == nullptr || !js->is_object()) {
        bad("response_format.json_schema must be an object with a schema",
            "response_format.json_schema");
      }
      const Json* schema = find(*js, "schema");
      if (schema == nullptr) {
        bad("response_format.json_schema.schema is required", "response_format.json_schema.schema");
      }
      claim("response_format");
      req.set_json_schema(schema->dump());
    } else if (t == "json_object") {
      claim("response_format");
      if (const Json* schema = find(*v, "schema")) {
        req.set_json_schema(schema->dump());
      } else {
        req.set_json_object(true);
      }
    } else if (t != "text") {
      bad("response_format type '" + t + "' is not supported (text, json_object, json_schema)",
          "response_format.type");
    }
  }
  if (const Json* v = find(body, "json_schema")) {
    claim("json_schema");
    req.set_json_schema(v->dump());
  }
  if (const Json* v = find(body, "grammar")) {
    if (!get_string(*v, "grammar").empty()) {
      claim("grammar");
      req.set_grammar(v->get<std::string>());
    }
  }
}

void read_sampling(const Json& body, v1::GenerateRequest& req) {
  v1::SamplingParams& s = *req.mutable_sampling();
  for (const FloatKey& k : kFloatKeys) {
    if (const Json* v = find(body, k.name)) (s.*k.set)(get_float(*v, k.name));
  }
  for (const IntKey& k : kIntKeys) {
    if (const Json* v = find(body, k.name)) (s.*k.set)(get_int32(*v, k.name));
  }
  if (const Json* v = find(body, "samplers")) {
    // llama-server: an array of names, or one string of names separated by ';'.
    if (v->is_string()) {
      s.set_samplers(v->get<std::string>());
    } else if (v->is_array()) {
      std::string joined;
      for (size_t i = 0; i < v->size(); ++i) {
        if (i > 0) joined += ';';
        joined += get_string((*v)[i], "samplers[" + std::to_string(i) + "]");
      }
      s.set_samplers(joined);
    } else {
      bad(not_a("samplers", "a string or an array of strings", *v), "samplers");
    }
  }
  if (const Json* v = find(body, "seed")) {
    const int64_t seed = get_integer(*v, "seed");
    if (seed < -1 || seed > static_cast<int64_t>(UINT32_MAX)) {
      bad("seed = " + v->dump() + " is out of range (0 to 4294967295, or -1 for random)", "seed");
    }
    if (seed >= 0) req.set_seed(static_cast<uint32_t>(seed));
  }
  if (const Json* v = find(body, "logit_bias")) {
    read_logit_bias(*v, *s.mutable_logit_bias(), *s.mutable_logit_bias_text());
  }
  read_constraint(body, req);
  if (const Json* v = find(body, "ignore_eos")) req.set_ignore_eos(get_bool(*v, "ignore_eos"));
  if (const Json* v = find(body, "cache_prompt")) {
    req.set_cache_prompt(get_bool(*v, "cache_prompt"));
  }
  if (const Json* v = find(body, "n_keep")) {
    // Kept tokens are at most the prompt anyway: a larger value means the whole prompt.
    const int64_t n = get_integer(*v, "n_keep");
    if (n < -1) bad("n_keep = " + v->dump() + " must be -1 (the whole prompt) or more", "n_keep");
    req.set_n_keep(n > INT32_MAX ? INT32_MAX : static_cast<int32_t>(n));
  }
  read_max_tokens(body, req);
  read_stop(body, req);
}

void read_options(const Json& body, OpenAiOptions& o) {
  if (const Json* v = find(body, "stream")) o.stream = get_bool(*v, "stream");
  if (const Json* v = find(body, "stream_options")) {
    if (!v->is_object()) bad(not_a("stream_options", "an object", *v), "stream_options");
    if (const Json* u = find(*v, "include_usage")) {
      o.include_usage = get_bool(*u, "stream_options.include_usage");
    }
  }
  if (const Json* v = find(body, "model")) o.model = get_string(*v, "model");
}

// Features with a default this runtime matches but no other value it can honour.
void refuse_unsupported_common(const Json& body) {
  if (const Json* v = find(body, "n")) {
    if (get_integer(*v, "n") != 1) bad("n = " + v->dump() + ": only n = 1 is supported", "n");
  }
}

// logprobs (a boolean) and top_logprobs (0-20), OpenAI's chat shape.
void read_chat_logprobs(const Json& body, v1::GenerateRequest& req) {
  if (const Json* v = find(body, "logprobs")) req.set_logprobs(get_bool(*v, "logprobs"));
  if (const Json* v = find(body, "top_logprobs")) {
    const int64_t n = get_integer(*v, "top_logprobs");
    if (n < 0 || n > 20) bad("top_logprobs = " + v->dump() + " is outside 0..20", "top_logprobs");
    if (n > 0 && !req.logprobs()) bad("top_logprobs needs logprobs: true", "top_logprobs");
    req.set_top_logprobs(static_cast<int32_t>(n));
  }
}

// The completions API's logprobs: an integer, how many alternatives (llama-server's n_probs too).
void read_text_logprobs(const Json& body, v1::GenerateRequest& req) {
  for (const char* key : {"logprobs", "n_probs"}) {
    const Json* v = find(body, key);
    if (v == nullptr || (v->is_boolean() && !v->get<bool>())) continue;
    const int64_t n = v->is_boolean() ? 0 : get_integer(*v, key);
    if (n < 0 || n > 20) bad(std::string(key) + " = " + v->dump() + " is outside 0..20", key);
    req.set_logprobs(true);
    req.set_top_logprobs(static_cast<int32_t>(n));
    return;
  }
}

void refuse_unsupported_chat(const Json& body) {
  refuse_unsupported_common(body);
  for (const char* key : {"functions", "function_call"}) {
    if (find(body, key) != nullptr) {
      bad(std::string(key) + " (deprecated) is not supported; use tools and tool_choice", key);
    }
  }
}

std::string message_content(const Json& v, const std::string& name) {
  if (v.is_null()) return {};
  if (v.is_string()) return v.get<std::string>();
  if (!v.is_array()) bad(not_a(name, "a string, null or an array of content parts", v), name);
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const Json& part = v[i];
    const std::string pname = name + "[" + std::to_string(i) + "]";
    if (!part.is_object()) bad(not_a(pname, "an object", part), pname);
    const Json* type = find(part, "type");
    if (type == nullptr) bad(pname + ".type is required", pname + ".type");
    const std::string& t = get_string(*type, pname + ".type");
    if (t != "text") {
      bad(pname + ": content part type '" + t + "': only text content is supported",
          pname + ".type");
    }
    const Json* part_text = find(part, "text");
    if (part_text == nullptr) bad(pname + ".text is required", pname + ".text");
    if (i > 0) text += '\n';  // as llama-server joins text parts for templates wanting strings
    text += get_string(*part_text, pname + ".text");
  }
  return text;
}

void read_tool_call(const Json& c, const std::string& where, v1::ToolCall& out) {
  if (!c.is_object()) bad(not_a(where, "an object", c), where);
  for (const auto& [key, value] : c.items()) {
    if (key != "id" && key != "type" && key != "function" && key != "index") {
      bad(where + ": unknown field '" + key + "'", where + "." + key);
    }
  }
  if (const Json* v = find(c, "id")) out.set_id(get_string(*v, where + ".id"));
  if (const Json* v = find(c, "type")) {
    if (get_string(*v, where + ".type") != "function") {
      bad(where + ".type must be 'function'", where + ".type");
    }
  }
  const Json* f = find(c, "function");
  if (f == nullptr) bad(where + ".function is required", where + ".function");
  if (!f->is_object()) bad(not_a(where + ".function", "an object", *f), where + ".function");
  const Json* name = find(*f, "name");
  if (name == nullptr) bad(where + ".function.name is required", where + ".function.name");
  out.set_name(get_string(*name, where + ".function.name"));
  const Json* args = find(*f, "arguments");
  if (args == nullptr) {
    out.set_arguments_json("{}");
  } else if (args->is_string()) {
    out.set_arguments_json(args->get<std::string>());  // JSON text; the validator parses it
  } else if (args->is_object()) {
    out.set_arguments_json(args->dump());
  } else {
    bad(not_a(where + ".function.arguments", "a string or an object", *args),
        where + ".function.arguments");
  }
}

// Keys OpenAI SDKs put into assistant messages they send back; accepted when empty.
bool empty_echo_field(const std::string& key, const Json& value) {
  if (key != "refusal" && key != "audio" && key != "annotations" && key != "function_call") {
    return false;
  }
  return value.is_null() || (value.is_array() && value.empty());
}

void read_message(const Json& m, const std::string& where, v1::ChatMessage& out) {
  if (!m.is_object()) bad(not_a(where, "an object", m), where);
  for (const auto& [key, value] : m.items()) {
    if (key == "role" || key == "content" || key == "name" || key == "tool_calls" ||
        key == "tool_call_id" || key == "reasoning_content" || empty_echo_field(key, value)) {
      continue;
    }
    bad(where + ": unknown field '" + key + "'", where + "." + key);
  }
  const Json* role = find(m, "role");
  if (role == nullptr) bad(where + ".role is required", where + ".role");
  const std::string& r = get_string(*role, where + ".role");
  out.set_role(r == "developer" ? "system" : r);  // OpenAI's newer name for system
  if (const auto it = m.find("content"); it != m.end()) {
    out.set_content(message_content(*it, where + ".content"));
  }
  if (const Json* v = find(m, "name")) out.set_name(get_string(*v, where + ".name"));
  if (const Json* v = find(m, "tool_call_id")) {
    out.set_tool_call_id(get_string(*v, where + ".tool_call_id"));
  }
  if (const Json* v = find(m, "reasoning_content")) {
    out.set_reasoning_content(get_string(*v, where + ".reasoning_content"));
  }
  if (const Json* v = find(m, "tool_calls")) {
    if (!v->is_array()) bad(not_a(where + ".tool_calls", "an array", *v), where + ".tool_calls");
    for (size_t k = 0; k < v->size(); ++k) {
      read_tool_call((*v)[k], where + ".tool_calls[" + std::to_string(k) + "]",
                     *out.add_tool_calls());
    }
  }
}

// tool_choice: "auto", "none", "required", or {"type": "function", "function": {"name": N}}.
void read_tool_choice(const Json& body, v1::ChatInput& chat) {
  if (const Json* v = find(body, "parallel_tool_calls")) {
    chat.set_parallel_tool_calls(get_bool(*v, "parallel_tool_calls"));
  }
  const Json* v = find(body, "tool_choice");
  if (v == nullptr) return;
  if (v->is_object()) {
    const Json* f = find(*v, "function");
    const Json* name = f != nullptr && f->is_object() ? find(*f, "name") : nullptr;
    if (name == nullptr) bad("tool_choice.function.name is required", "tool_choice.function.name");
    const std::string& n = get_string(*name, "tool_choice.function.name");
    if (n.empty() || n == "auto" || n == "none" || n == "required") {
      bad("tool_choice.function.name '" + n + "' is not a function name",
          "tool_choice.function.name");
    }
    chat.set_tool_choice(n);
    return;
  }
  const std::string& choice = get_string(*v, "tool_choice");
  if (choice != "none" && choice != "auto" && choice != "required") {
    bad("tool_choice '" + choice + "' is not one of auto, none, required (or a function object)",
        "tool_choice");
  }
  chat.set_tool_choice(choice);
}

void read_tools(const Json& body, v1::ChatInput& chat) {
  read_tool_choice(body, chat);
  const Json* tools = find(body, "tools");
  if (tools == nullptr) return;
  if (!tools->is_array()) bad(not_a("tools", "an array", *tools), "tools");
  for (size_t i = 0; i < tools->size(); ++i) {
    const Json& t = (*tools)[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!t.is_object()) bad(not_a(where, "an object", t), where);
    const Json* type = find(t, "type");
    if (type == nullptr || get_string(*type, where + ".type") != "function") {
      bad(where + ".type must be 'function'", where + ".type");
    }
    const Json* f = find(t, "function");
    if (f == nullptr || !f->is_object()) {
      bad(where + ".function must be an object", where + ".function");
    }
    const Json* name = find(*f, "name");
    if (name == nullptr || get_string(*name, where + ".function.name").empty()) {
      bad(where + ".function.name is required", where + ".function.name");
    }
    chat.add_tools_json(t.dump());
  }
}

// chat_template_kwargs (llama-server's): enable_thinking as its own field, any other variable
// into template_vars_json; and OpenAI's reasoning_effort, which gpt-oss's template reads.
void read_chat_template_kwargs(const Json& body, v1::ChatInput& chat) {
  Json vars = Json::object();
  if (const Json* kw = find(body, "chat_template_kwargs")) {
    if (!kw->is_object())
      bad(not_a("chat_template_kwargs", "an object", *kw), "chat_template_kwargs");
    if (kw->size() > 32)
      bad("chat_template_kwargs has more than 32 entries", "chat_template_kwargs");
    for (const auto& [key, value] : kw->items()) {
      const std::string name = "chat_template_kwargs." + key;
      if (key == "enable_thinking") {
        if (!value.is_null()) chat.set_enable_thinking(get_bool(value, name));
        continue;
      }
      const bool identifier =
          !key.empty() && key.size() <= 64 &&
          std::all_of(
              key.begin(), key.end(),
              [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }) &&
          !std::isdigit(static_cast<unsigned char>(key[0]));
      if (!identifier) {
        bad("chat_template_kwargs: '" + key.substr(0, 64) +
                "' is not a template variable name (letters, digits and _, at most 64)",
            "chat_template_kwargs");
      }
      vars[key] = value;
    }
  }
  if (const Json* effort = find(body, "reasoning_effort");
      effort != nullptr && !effort->is_null()) {
    const std::string& e = get_string(*effort, "reasoning_effort");
    if (e != "minimal" && e != "low" && e != "medium" && e != "high") {
      bad("reasoning_effort must be minimal, low, medium or high", "reasoning_effort");
    }
    if (vars.contains("reasoning_effort") && vars["reasoning_effort"] != *effort) {
      bad("reasoning_effort differs from chat_template_kwargs.reasoning_effort",
          "reasoning_effort");
    }
    vars["reasoning_effort"] = e;
  }
  if (vars.empty()) return;
  std::string text = vars.dump();
  if (text.size() > 16384) {
    bad("chat_template_kwargs is over 16 KiB as JSON", "chat_template_kwargs");
  }
  chat.set_template_vars_json(std::move(text));
}

void require_object(const Json& body) {
  if (!body.is_object()) {
    throw HttpError(400,
                    std::string("the request body must be a JSON object, not ") + body.type_name());
  }
}

v1::GenerateRequest chat_request(const Json& body, OpenAiOptions* opts) {
  require_object(body);
  refuse_unsupported_chat(body);
  OpenAiOptions o;
  read_options(body, o);
  v1::GenerateRequest req;
  v1::ChatInput& chat = *req.mutable_chat();
  const Json* messages = find(body, "messages");
  if (messages == nullptr) bad("messages is required", "messages");
  if (!messages->is_array()) bad(not_a("messages", "an array", *messages), "messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    read_message((*messages)[i], "messages[" + std::to_string(i) + "]", *chat.add_messages());
  }
  read_tools(body, chat);
  read_chat_template_kwargs(body, chat);
  read_sampling(body, req);
  read_chat_logprobs(body, req);
  if (opts != nullptr) *opts = std::move(o);
  return req;
}

void read_token_ids(const Json& arr, const std::string& name, v1::TokenIds& out) {
  for (size_t i = 0; i < arr.size(); ++i) {
    const std::string item = name + "[" + std::to_string(i) + "]";
    if (!arr[i].is_number_integer()) bad(not_a(item, "a token id (integer)", arr[i]), item);
    out.add_ids(get_int32(arr[i], item));
  }
}

void read_prompt(const Json& body, v1::GenerateRequest& req) {
  const Json* p = find(body, "prompt");
  if (p == nullptr) bad("prompt is required", "prompt");
  if (p->is_string()) {
    req.set_text(p->get<std::string>());
    return;
  }
  const char* kShapes = "a string, an array of token ids, or an array with one string";
  if (!p->is_array()) bad(not_a("prompt", kShapes, *p), "prompt");
  if (p->empty()) bad("prompt is empty", "prompt");
  const Json& first = (*p)[0];
  if (first.is_number()) {
    read_token_ids(*p, "prompt", *req.mutable_tokens());
    return;
  }
  if (!first.is_string() && !first.is_array()) {
    bad(not_a("prompt[0]", "a string or a token id", first), "prompt[0]");
  }
  if (p->size() > 1) {
    bad("prompt has " + std::to_string(p->size()) +
            " prompts; only one prompt per request is supported",
        "prompt");
  }
  if (first.is_string()) {
    req.set_text(first.get<std::string>());
  } else {
    read_token_ids(first, "prompt[0]", *req.mutable_tokens());
  }
}

v1::GenerateRequest text_request(const Json& body, OpenAiOptions* opts) {
  require_object(body);
  refuse_unsupported_common(body);
  if (const Json* v = find(body, "echo")) {
    if (get_bool(*v, "echo")) bad("echo is not supported", "echo");
  }
  if (const Json* v = find(body, "best_of")) {
    if (get_integer(*v, "best_of") != 1) {
      bad("best_of = " + v->dump() + ": only best_of = 1 is supported", "best_of");
    }
  }
  if (const Json* v = find(body, "suffix")) {
    if (!get_string(*v, "suffix").empty()) bad("suffix is not supported", "suffix");
  }
  OpenAiOptions o;
  read_options(body, o);
  v1::GenerateRequest req;
  read_prompt(body, req);
  read_sampling(body, req);
  read_text_logprobs(body, req);
  if (opts != nullptr) *opts = std::move(o);
  return req;
}

}  // namespace

std::string_view error_type_for_status(int status) {
  switch (status) {
    case 400:
    case 413:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 429:
      return "rate_limit_error";
    case 501:
      return "not_supported_error";
    case 503:
      return "unavailable_error";
    default:
      return "server_error";
  }
}

HttpError::HttpError(int status_, const std::string& message, std::optional<std::string> param_,
                     std::string type_)
    : moe::Error(message),
      status(status_),
      type(type_.empty() ? std::string(error_type_for_status(status_)) : std::move(type_)),
      param(std::move(param_)) {}

nlohmann::ordered_json parse_json_body(std::string_view body) {
  try {
    return parse_bounded_json(body);
  } catch (const nlohmann::json::exception& e) {
    throw HttpError(400, std::string("the request body is not valid JSON: ") + e.what());
  } catch (const JsonLimitError& e) {
    throw HttpError(400, std::string("the request body is refused: ") + e.what());
  }
}

v1::GenerateRequest chat_completion_request(const nlohmann::ordered_json& body,
                                            OpenAiOptions* opts) {
  return chat_request(body, opts);
}

v1::GenerateRequest chat_completion_request(const nlohmann::json& body, OpenAiOptions* opts) {
  return chat_request(nlohmann::ordered_json(body), opts);
}

v1::GenerateRequest completion_request(const nlohmann::ordered_json& body, OpenAiOptions* opts) {
  return text_request(body, opts);
}

v1::GenerateRequest completion_request(const nlohmann::json& body, OpenAiOptions* opts) {
  return text_request(nlohmann::ordered_json(body), opts);
}

}  // namespace moe::http
