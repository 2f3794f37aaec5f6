// Conversion between nlohmann JSON (the chat messages) and Jinja values, and Python's
// json.dumps, which is what HF's `tojson` filter calls.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "coordinator/chat_template/jinja_value.h"

namespace moe::jinja {

Value from_json(const nlohmann::ordered_json& j);

struct DumpOptions {
  std::optional<std::string> indent;  // nullopt: single line
  std::string item_separator = ", ";  // Python: ", " without indent, "," with indent
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;  // HF passes ensure_ascii=False
};

// json.dumps(value, ...). Throws jinja::Error for values JSON cannot represent (Undefined,
// functions, namespaces), like Python's TypeError.
std::string dumps(const Value& v, const DumpOptions& opt);

}  // namespace moe::jinja
