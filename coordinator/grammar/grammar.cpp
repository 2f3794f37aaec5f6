// Grammar::parse: the GBNF text parsed (gbnf_parser), checked (root, left recursion) and flattened
// into the element arrays the matcher walks (grammar_impl.h).
#include "coordinator/grammar/grammar.h"

#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "coordinator/grammar/gbnf_parser.h"
#include "coordinator/grammar/grammar_impl.h"

namespace moe::grammar {
namespace {

// Which rules can match the empty string: a worklist over "symbols not yet known nullable" per
// alternative, so it is linear in the grammar's size (a fixed point loop could be quadratic).
std::vector<bool> nullable_rules(const ParsedGrammar& g) {
  const size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  struct AltRef {
    uint32_t rule, alt;
  };
  std::vector<std::vector<AltRef>> uses(n);  // rule -> the alternatives it appears in (per use)
  std::vector<std::vector<size_t>> pending(n);
  std::vector<uint32_t> work;
  for (uint32_t r = 0; r < n; ++r) {
    const auto& alts = g.rules[r].alts;
    pending[r].assign(alts.size(), 0);
    for (uint32_t a = 0; a < alts.size(); ++a) {
      bool has_char = false;
      for (const Symbol& s : alts[a]) has_char |= !s.is_rule;
      if (has_char) {
        pending[r][a] = SIZE_MAX;  // never nullable
        continue;
      }
      pending[r][a] = alts[a].size();
      for (const Symbol& s : alts[a]) uses[s.arg].push_back({r, a});
      if (alts[a].empty() && !nullable[r]) {
        nullable[r] = true;
        work.push_back(r);
      }
    }
  }
  while (!work.empty()) {
    const uint32_t r = work.back();
    work.pop_back();
    for (const AltRef& u : uses[r]) {
      if (--pending[u.rule][u.alt] == 0 && !nullable[u.rule]) {
        nullable[u.rule] = true;
        work.push_back(u.rule);
      }
    }
  }
  return nullable;
}

// The user's rule a generated rule `name_3` belongs to.
std::string user_rule(const std::string& name) { return name.substr(0, name.find('_')); }

// Left recursion (a rule reaching itself before any character, also through rules that can be
// empty) would make the matcher expand forever: refused, naming the rule. Iterative DFS.
void check_left_recursion(std::string_view text, const ParsedGrammar& g) {
  const auto nullable = nullable_rules(g);
  const size_t n = g.rules.size();
  std::vector<std::vector<uint32_t>> first(n);  // rules that can come first in r
  for (uint32_t r = 0; r < n; ++r) {
    for (const auto& alt : g.rules[r].alts) {
      for (const Symbol& s : alt) {
        if (!s.is_rule) break;
        first[r].push_back(s.arg);
        if (!nullable[s.arg]) break;
      }
    }
  }
  enum : uint8_t { kNew, kOnPath, kDone };
  std::vector<uint8_t> color(n, kNew);
  std::vector<std::pair<uint32_t, size_t>> path;  // rule, next edge to follow
  for (uint32_t start = 0; start < n; ++start) {
    if (color[start] != kNew) continue;
    color[start] = kOnPath;
    path.push_back({start, 0});
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == first[r].size()) {
        color[r] = kDone;
        path.pop_back();
        continue;
      }
      const uint32_t to = first[r][next++];
      if (color[to] == kOnPath) {
        const ParsedRule& rule = g.rules[to];
        throw_at(text, rule.offset,
                 "rule '" + user_rule(rule.name) +
                     "' is left-recursive (it can reach itself before reading a character)");
      }
      if (color[to] == kNew) {
        color[to] = kOnPath;
        path.push_back({to, 0});
      }
    }
  }
}

std::unique_ptr<GrammarImpl> flatten(ParsedGrammar&& g, uint32_t root) {
  auto impl = std::make_unique<GrammarImpl>();
  impl->root = root;
  impl->classes = std::move(g.classes);
  for (auto& rule : g.rules) {
    impl->rule_begin.push_back(static_cast<uint32_t>(impl->elements.size()));
    impl->rule_names.push_back(std::move(rule.name));
    auto& starts = impl->alt_begin.emplace_back();
    for (size_t a = 0; a < rule.alts.size(); ++a) {
      starts.push_back(static_cast<uint32_t>(impl->elements.size()));
      for (const Symbol& s : rule.alts[a]) {
        impl->elements.push_back({s.is_rule ? Op::Rule : Op::Class, s.arg});
      }
      impl->elements.push_back({a + 1 == rule.alts.size() ? Op::End : Op::Alt, 0});
    }
  }
  return impl;
}

}  // namespace

std::shared_ptr<const Grammar> Grammar::parse(std::string_view gbnf, std::string_view root,
                                              const GrammarLimits& limits) {
  ParsedGrammar g = parse_gbnf(gbnf, limits);
  uint32_t root_id = UINT32_MAX;
  for (uint32_t r = 0; r < g.rules.size(); ++r) {
    if (g.rules[r].name == root) root_id = r;
  }
  if (root_id == UINT32_MAX) throw moe::Error("grammar: no rule '" + std::string(root) + "'");
  check_left_recursion(gbnf, g);
  return std::shared_ptr<const Grammar>(new Grammar(flatten(std::move(g), root_id), limits));
}

Grammar::Grammar(std::unique_ptr<GrammarImpl> impl, GrammarLimits limits)
    : impl_(std::move(impl)), limits_(limits) {}

Grammar::~Grammar() = default;

}  // namespace moe::grammar
