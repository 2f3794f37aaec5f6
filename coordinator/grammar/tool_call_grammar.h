// Grammars for Qwen3's tool calls (tool_choice "required" or a named function) and for an optional
// think block before a constrained reply. A call is written exactly as Qwen3's chat template
// renders one and as coordinator/http/qwen_output_parser.cpp reads it:
//
//   <tool_call>\n{"name": "<fname>", "arguments": <args JSON>}\n</tool_call>
//
// with calls separated by "\n" (the template's spacing; the arguments' JSON has the ordinary
// bounded whitespace of json_schema_grammar.h). Parallel calls are bounded to kMaxParallelCalls.
//
// Rule names the grammars write: `root`, `tc-*`, `think*`, and `f<i>-*` for the arguments of the
// i-th tool. A grammar combined with think_prefix_gbnf must not use those (give it a prefix).
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace moe::grammar {

inline constexpr size_t kMaxParallelCalls = 32;  // bounds a random model's run of calls
inline constexpr size_t kMaxTools = 512;

struct ToolCallGrammarOptions {
  // OpenAI tool objects {"type":"function","function":{"name","parameters",...}} (ordered_json:
  // the order of the parameters' properties is the order the grammar asks for).
  std::vector<nlohmann::ordered_json> tools;
  std::string only_function;  // non-empty: tool_choice names this function
  bool parallel = true;       // parallel_tool_calls: one or more calls, else exactly one
  bool allow_think = false;   // "<think>...</think>" (no "</think>" inside) and whitespace first
};

// GBNF (rule `root`) for an assistant turn that is one or more tool calls, each call's arguments
// valid against its function's parameters schema (absent = any JSON object; a schema without
// `type` is taken as an object schema; one whose type is not "object" is refused). Throws
// moe::Error naming the tool for a tool without a name, a duplicate name, an unknown
// only_function, or a parameters schema json_schema_to_gbnf refuses.
std::string tool_call_gbnf(const ToolCallGrammarOptions& opt);

// The rules that put an optional think block before the rule `inner_root`, including
// `root ::= think? <inner_root>`: append them to a grammar whose root is named otherwise
// (response_format with a thinking model). The block is "<think>", any text without "</think>",
// "</think>", then at most 8 whitespace characters.
std::string think_prefix_gbnf(std::string_view inner_root);

}  // namespace moe::grammar
