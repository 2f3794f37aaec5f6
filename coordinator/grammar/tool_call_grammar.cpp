#include "coordinator/grammar/tool_call_grammar.h"

#include <set>

#include "common/error.h"
#include "coordinator/grammar/json_schema_grammar.h"

namespace moe::grammar {

namespace {

using Json = nlohmann::ordered_json;

// A GBNF literal of UTF-8 text.
std::string lit(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out = "\"";
  for (const char ch : bytes) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\' || c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

// The arguments' schema as an object schema: absent = any object, no `type` = type object.
std::string arguments_gbnf(const Json& function, const std::string& prefix,
                           const std::string& where) {
  const SchemaGrammarOptions opt{prefix};
  const auto it = function.find("parameters");
  if (it == function.end() || *it == true || (it->is_object() && it->empty())) {
    return json_object_gbnf(opt);
  }
  Json params = *it;
  if (!params.is_object()) throw Error(where + ": parameters must be a JSON Schema object");
  if (!params.contains("type")) {
    params["type"] = "object";
  } else if (params["type"] != "object") {
    throw Error(where + ": parameters must have type \"object\", not " + params["type"].dump());
  }
  try {
    return json_schema_to_gbnf(params, opt);
  } catch (const Error& e) {
    throw Error(where + ": parameters: " + e.what());
  }
}

}  // namespace

std::string tool_call_gbnf(const ToolCallGrammarOptions& opt) {
  if (opt.tools.empty()) throw Error("tool call grammar: no tools");
  if (opt.tools.size() > kMaxTools) {
    throw Error("tool call grammar: more than " + std::to_string(kMaxTools) + " tools");
  }
  std::string rules, calls;
  std::set<std::string> names;
  for (size_t i = 0; i < opt.tools.size(); ++i) {
    const Json& tool = opt.tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    if (!tool.is_object()) throw Error(where + ": must be an object");
    if (tool.contains("type") && tool["type"] != "function") {
      throw Error(where + ": type " + tool["type"].dump() +
                  " is not supported (only \"function\")");
    }
    const auto fn = tool.find("function");
    if (fn == tool.end() || !fn->is_object()) throw Error(where + ": no \"function\" object");
    const auto name_it = fn->find("name");
    if (name_it == fn->end() || !name_it->is_string() ||
        name_it->get_ref<const std::string&>().empty()) {
      throw Error(where + ": the function has no name");
    }
    const std::string name = name_it->get<std::string>();
    if (!names.insert(name).second)
      throw Error(where + ": function '" + name + "' is defined twice");
    if (!opt.only_function.empty() && name != opt.only_function) continue;
    const std::string prefix = std::string(1, 'f').append(std::to_string(i)).append("-");
    rules += arguments_gbnf(*fn, prefix, where + " (function '" + name + "')");
    // Exactly the template's spacing around the arguments, which keep their own whitespace.
    const std::string head = "<tool_call>\n{\"name\": " + Json(name).dump() + ", \"arguments\": ";
    const std::string call = "tc-call-" + std::to_string(i);
    rules += call + " ::= " + lit(head) + " " + prefix + "root " + lit("}\n</tool_call>") + "\n";
    calls += (calls.empty() ? "" : " | ") + call;
  }
  if (!opt.only_function.empty() && calls.empty()) {
    throw Error("tool_choice names function '" + opt.only_function +
                "', which is not among the tools");
  }
  rules += "tc-call ::= " + calls + "\n";
  rules += "tc-calls ::= tc-call";
  if (opt.parallel) rules += " (\"\\n\" tc-call){0," + std::to_string(kMaxParallelCalls - 1) + "}";
  rules += "\n";
  rules += opt.allow_think ? think_prefix_gbnf("tc-calls") : "root ::= tc-calls\n";
  return rules;
}

std::string think_prefix_gbnf(std::string_view inner_root) {
  // Text without "</think>": every '<' starts a run of '<' that either leaves the tag's spelling
  // (think-lt, inside the text) or ends as a proper beginning of "</think>" right before the
  // closing tag (think-tail). Neither can run past "</think", so the first "</think>" closes.
  std::string out;
  out += "root ::= think? " + std::string(inner_root) + "\n";
  out += R"g(think ::= "<think>" think-text "</think>" [ \t\r\n]{0,8})g"
         "\n";
  out += "think-text ::= ([^<] | think-lt)* think-tail?\n";
  out +=
      R"g(think-lt ::= "<"+ ([^/<] | "/" ([^t<] | "t" ([^h<] | "h" ([^i<] | "i" ([^n<] | "n" ([^k<] | "k" [^><])))))))g"
      "\n";
  out += R"g(think-tail ::= "<"+ ("/" ("t" ("h" ("i" ("n" "k"?)?)?)?)?)?)g"
         "\n";
  return out;
}

}  // namespace moe::grammar
