#include "coordinator/cli/chat_input.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "coordinator/cli/cli_error.h"
#include "coordinator/cli/output.h"

namespace moe::cli {

namespace {

// Keys keep the file's order: templates render tool definitions and arguments as written.
using json = nlohmann::ordered_json;

json read_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UsageError("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    throw UsageError(path + ": invalid JSON: " + e.what());
  }
}

// "BASE[i]": where an element of an array is, e.g. "FILE: [2].tool_calls[0]".
std::string indexed(const std::string& base, size_t i) {
  return cat(base, '[', std::to_string(i), ']');
}

std::string string_value(const json& v, const std::string& where, bool null_is_empty = false) {
  if (v.is_string()) return v.get<std::string>();
  if (null_is_empty && v.is_null()) return {};
  throw UsageError(
      cat(where, ": expected a string", null_is_empty ? " or null" : "", ", got ", v.type_name()));
}

[[noreturn]] void unknown_key(const std::string& where, const std::string& key, const char* known) {
  throw UsageError(where + ": unknown key \"" + key + "\" (known keys: " + known + ")");
}

void parse_tool_call(const json& j, const std::string& where, moe::v1::ToolCall& call) {
  if (!j.is_object()) throw UsageError(where + ": expected an object, got " + j.type_name());
  for (const auto& [key, v] : j.items()) {
    const std::string w = where + "." + key;
    if (key == "id") {
      call.set_id(string_value(v, w));
    } else if (key == "name") {
      call.set_name(string_value(v, w));
    } else if (key == "arguments") {
      if (v.is_object())
        call.set_arguments_json(v.dump());
      else if (v.is_string())
        call.set_arguments_json(v.get<std::string>());
      else
        throw UsageError(w + ": expected an object or its JSON text, got " + v.type_name());
    } else {
      unknown_key(where, key, "id, name, arguments");
    }
  }
}

void parse_message(const json& j, const std::string& where, moe::v1::ChatMessage& m) {
  if (!j.is_object()) throw UsageError(where + ": expected an object, got " + j.type_name());
  for (const auto& [key, v] : j.items()) {
    const std::string w = where + "." + key;
    if (key == "role") {
      m.set_role(string_value(v, w));
    } else if (key == "content") {
      m.set_content(string_value(v, w, /*null_is_empty=*/true));
    } else if (key == "reasoning_content") {
      m.set_reasoning_content(string_value(v, w, /*null_is_empty=*/true));
    } else if (key == "tool_call_id") {
      m.set_tool_call_id(string_value(v, w));
    } else if (key == "name") {
      m.set_name(string_value(v, w));
    } else if (key == "tool_calls") {
      if (!v.is_array()) throw UsageError(w + ": expected an array, got " + v.type_name());
      for (size_t i = 0; i < v.size(); ++i)
        parse_tool_call(v[i], indexed(w, i), *m.add_tool_calls());
    } else {
      unknown_key(where, key, "role, content, reasoning_content, tool_calls, tool_call_id, name");
    }
  }
}

}  // namespace

void add_message(moe::v1::ChatInput& chat, std::string_view role, std::string_view content) {
  moe::v1::ChatMessage* m = chat.add_messages();
  m->set_role(std::string(role));
  m->set_content(std::string(content));
}

void add_messages_file(moe::v1::ChatInput& chat, const std::string& path) {
  const json j = read_json(path);
  if (!j.is_array())
    throw UsageError(path + ": expected a JSON array of messages, got " + j.type_name());
  for (size_t i = 0; i < j.size(); ++i)
    parse_message(j[i], indexed(path + ": ", i), *chat.add_messages());
}

void add_tools_file(moe::v1::ChatInput& chat, const std::string& path) {
  const json j = read_json(path);
  if (!j.is_array())
    throw UsageError(path + ": expected a JSON array of tools, got " + j.type_name());
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_object()) {
      throw UsageError(
          cat(indexed(path + ": ", i), ": expected an object, got ", j[i].type_name()));
    }
    chat.add_tools_json(j[i].dump());
  }
}

moe::v1::ChatInput build_chat_input(const ChatSourceArgs& args) {
  moe::v1::ChatInput chat;
  if (args.messages_path) {
    add_messages_file(chat, *args.messages_path);
  } else {
    if (args.system) add_message(chat, "system", *args.system);
    if (args.user) add_message(chat, "user", *args.user);
  }
  if (args.tools_path) add_tools_file(chat, *args.tools_path);
  if (args.no_think) chat.set_enable_thinking(false);
  return chat;
}

}  // namespace moe::cli
