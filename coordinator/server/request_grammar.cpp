#include "coordinator/server/request_grammar.h"

#include <nlohmann/json.hpp>
#include <string_view>

#include "common/bounded_json.h"
#include "coordinator/grammar/json_schema_grammar.h"
#include "coordinator/grammar/tool_call_grammar.h"
#include "coordinator/server/request_validation.h"

namespace moe::server {
namespace {

bool ends_with(const std::string& s, std::string_view tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

nlohmann::ordered_json parse_field(const std::string& text, const std::string& field) {
  require_utf8(text, field);
  try {
    return parse_bounded_json(text);
  } catch (const nlohmann::json::exception& e) {
    throw BadRequest(field + " is not valid JSON: " + e.what());
  } catch (const JsonLimitError& e) {
    throw BadRequest(field + " is refused: " + e.what());
  }
}

std::shared_ptr<const grammar::Grammar> compile(const std::string& gbnf, const std::string& field) {
  try {
    return grammar::Grammar::parse(gbnf);
  } catch (const moe::Error& e) {
    throw BadRequest(field + ": " + e.what());
  }
}

// The converters' grammars define `root` at the start of a line; renamed so the think block can
// come first. (A scan, not std::regex: GCC 12 warns inside <regex> under the sanitizers.)
std::string rename_root(const std::string& gbnf, const std::string& name) {
  std::string out;
  size_t pos = 0;
  while (pos < gbnf.size()) {
    size_t end = gbnf.find('\n', pos);
    end = end == std::string::npos ? gbnf.size() : end + 1;
    std::string_view line(gbnf.data() + pos, end - pos);
    size_t k = 4;
    while (k < line.size() && (line[k] == ' ' || line[k] == '\t')) ++k;
    if (line.substr(0, 4) == "root" && line.substr(k, 3) == "::=") {
      out += name + " ::=";
      out += line.substr(k + 3);
    } else {
      out += line;
    }
    pos = end;
  }
  return out;
}

std::string tool_grammar(const v1::GenerateRequest& req) {
  const v1::ChatInput& chat = req.chat();
  grammar::ToolCallGrammarOptions opt;
  for (int i = 0; i < chat.tools_json_size(); ++i) {
    opt.tools.push_back(
        parse_field(chat.tools_json(i), "chat.tools_json[" + std::to_string(i) + "]"));
  }
  if (opt.tools.empty()) {
    throw BadRequest("tool_choice '" + chat.tool_choice() + "' needs tools, and none were given");
  }
  if (chat.tool_choice() != "required") opt.only_function = chat.tool_choice();
  opt.parallel = !chat.has_parallel_tool_calls() || chat.parallel_tool_calls();
  try {
    return grammar::tool_call_gbnf(opt);
  } catch (const moe::Error& e) {
    throw BadRequest(std::string("tool_choice: ") + e.what());
  }
}

}  // namespace

ThinkMode think_mode(const std::string& rendered_prompt, bool is_chat) {
  if (!is_chat) return ThinkMode::None;
  std::string p = rendered_prompt;
  while (!p.empty() && (p.back() == '\n' || p.back() == ' ')) p.pop_back();
  if (ends_with(p, "</think>")) return ThinkMode::None;
  if (ends_with(p, "<think>")) return ThinkMode::Inside;
  return ThinkMode::Open;
}

std::string think_wrapper_gbnf(ThinkMode think, const std::string& inner_root) {
  if (think == ThinkMode::None) return "root ::= " + inner_root + "\n";
  // Any text without "</think>", as the states of matching that word: tbK has matched its first
  // K characters. Only '<' restarts a match, since it occurs once in the word.
  static const char* const kBody =
      "think-body ::= tb0\n"
      "tb0 ::= [^<] tb0 | \"<\" tb1 | \"\"\n"
      "tb1 ::= \"<\" tb1 | \"/\" tb2 | [^</] tb0 | \"\"\n"
      "tb2 ::= \"<\" tb1 | \"t\" tb3 | [^<t] tb0 | \"\"\n"
      "tb3 ::= \"<\" tb1 | \"h\" tb4 | [^<h] tb0 | \"\"\n"
      "tb4 ::= \"<\" tb1 | \"i\" tb5 | [^<i] tb0 | \"\"\n"
      "tb5 ::= \"<\" tb1 | \"n\" tb6 | [^<n] tb0 | \"\"\n"
      "tb6 ::= \"<\" tb1 | \"k\" tb7 | [^<k] tb0 | \"\"\n"
      "tb7 ::= \"<\" tb1 | [^<>] tb0 | \"\"\n"
      "think-end ::= \"</think>\" [ \\t\\n]{0,4}\n";
  if (think == ThinkMode::Inside) {
    return std::string("root ::= think-body think-end ") + inner_root + "\n" + kBody;
  }
  return std::string("root ::= (\"<think>\" think-body think-end)? ") + inner_root + "\n" + kBody;
}

std::shared_ptr<const grammar::Grammar> request_grammar(const v1::GenerateRequest& req,
                                                        ThinkMode think) {
  std::string inner;  // GBNF whose start rule is `root`
  std::string field;
  switch (req.constraint_case()) {
    case v1::GenerateRequest::kGrammar:
      require_utf8(req.grammar(), "grammar");
      if (req.grammar().empty()) throw BadRequest("grammar is empty");
      // A user's grammar is the whole output, as llama.cpp applies it: no think block added.
      return compile(req.grammar(), "grammar");
    case v1::GenerateRequest::kJsonSchema:
      field = "json_schema";
      try {
        inner = grammar::json_schema_to_gbnf(parse_field(req.json_schema(), field));
      } catch (const BadRequest&) {
        throw;
      } catch (const moe::Error& e) {
        throw BadRequest(field + ": " + e.what());
      }
      break;
    case v1::GenerateRequest::kJsonObject:
      if (!req.json_object()) return nullptr;
      field = "json_object";
      inner = grammar::json_object_gbnf();
      break;
    default:
      break;
  }
  const bool tools_forced =
      req.input_case() == v1::GenerateRequest::kChat &&
      (req.chat().tool_choice() == "required" ||
       (!req.chat().tool_choice().empty() && req.chat().tool_choice() != "auto" &&
        req.chat().tool_choice() != "none"));
  if (tools_forced) {
    if (!inner.empty()) {
      throw BadRequest("tool_choice '" + req.chat().tool_choice() + "' and " + field +
                       " cannot be combined: the reply is either tool calls or the document");
    }
    field = "tool_choice";
    inner = tool_grammar(req);
  }
  if (inner.empty()) return nullptr;
  return compile(rename_root(inner, "answer") + think_wrapper_gbnf(think, "answer"), field);
}

}  // namespace moe::server
