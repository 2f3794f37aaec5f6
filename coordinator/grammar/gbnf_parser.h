// GBNF text -> rules (internal to coordinator/grammar). The syntax of llama.cpp's grammars:
//
//   name ::= alternative | alternative ...      names: [a-zA-Z0-9-]+
//   items: "literal"  [class]  [^negated]  .  name  ( group )
//   postfix: *  +  ?  {m}  {m,}  {m,n}  {,n}
//   # comment to the end of the line
//
// A rule ends at a newline outside parentheses (a newline may follow `::=` and `|`). Groups and
// repetitions become generated rules named `<rule>_<n>` (user names cannot hold `_`). A rule
// defined twice is refused (llama.cpp lets the later one replace the first silently; here that is
// almost always a mistake in a generated grammar, so it is reported with both places).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/grammar/grammar.h"
#include "coordinator/grammar/grammar_impl.h"

namespace moe::grammar {

struct Symbol {
  bool is_rule;  // else a character class
  uint32_t arg;  // rule id or class index
};

struct ParsedRule {
  std::string name;
  std::vector<std::vector<Symbol>> alts;
  size_t offset = 0;  // where it is defined (generated: where its group or repetition is)
  bool defined = false;
  size_t first_use = 0;  // where it is first referenced
};

struct ParsedGrammar {
  std::vector<ParsedRule> rules;
  std::vector<CharClass> classes;
};

// Throws moe::Error("grammar: line L, column C: ...") for a syntax error, a rule defined twice, an
// undefined rule and every limit but max_stacks. Recursion is bounded by limits.max_nesting.
ParsedGrammar parse_gbnf(std::string_view text, const GrammarLimits& limits);

// "grammar: line L, column C: what" for byte `offset` of `text` (columns count characters).
[[noreturn]] void throw_at(std::string_view text, size_t offset, const std::string& what);

}  // namespace moe::grammar
