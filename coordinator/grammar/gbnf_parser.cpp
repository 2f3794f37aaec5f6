#include "coordinator/grammar/gbnf_parser.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/error.h"

namespace moe::grammar {

void throw_at(std::string_view text, size_t offset, const std::string& what) {
  offset = std::min(offset, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') ++line, line_start = i + 1;
  }
  size_t column = 1;  // characters, not bytes: continuation bytes do not count
  for (size_t i = line_start; i < offset; ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) ++column;
  }
  throw moe::Error("grammar: line " + std::to_string(line) + ", column " + std::to_string(column) +
                   ": " + what);
}

CharClass make_char_class(std::vector<std::pair<char32_t, char32_t>> ranges, bool negated) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<char32_t, char32_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  CharClass c;
  if (negated) {
    char32_t next = 0;  // first code point not yet covered by a gap
    for (const auto& r : merged) {
      if (r.first > next) c.ranges.emplace_back(next, r.first - 1);
      next = r.second + 1;
    }
    if (next <= kMaxCodePoint) c.ranges.emplace_back(next, kMaxCodePoint);
  } else {
    c.ranges = std::move(merged);
  }
  for (const auto& r : c.ranges) {
    for (char32_t cp = r.first; cp <= r.second && cp < 128; ++cp)
      c.ascii[cp >> 6] |= 1ull << (cp & 63);
  }
  return c;
}

namespace {

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  Parser(std::string_view text, const GrammarLimits& limits) : s_(text), limits_(limits) {}

  ParsedGrammar run() {
    if (s_.size() > limits_.max_text_bytes) {
      throw moe::Error("grammar: the text is " + std::to_string(s_.size()) +
                       " bytes, more than max_text_bytes (" +
                       std::to_string(limits_.max_text_bytes) + ")");
    }
    for (;;) {
      skip_space(true);
      if (p_ >= s_.size()) break;
      parse_rule();
    }
    for (const auto& r : g_.rules) {
      if (!r.defined) throw_at(s_, r.first_use, "undefined rule '" + r.name + "'");
    }
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const { throw_at(s_, at, what); }

  char peek(size_t ahead = 0) const { return p_ + ahead < s_.size() ? s_[p_ + ahead] : '\0'; }
  bool at_end() const { return p_ >= s_.size(); }
  bool at_newline() const { return peek() == '\n' || peek() == '\r'; }

  // Spaces, tabs and comments; newlines too where a rule cannot end.
  void skip_space(bool newline_ok) {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t') {
        ++p_;
      } else if (c == '#') {
        while (!at_end() && !at_newline()) ++p_;
      } else if (newline_ok && (c == '\n' || c == '\r')) {
        ++p_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t b = p_;
    while (!at_end() && is_name_char(peek())) ++p_;
    if (p_ == b) fail(b, "expected a rule name");
    return std::string(s_.substr(b, p_ - b));
  }

  uint32_t add_rule(std::string name, size_t at) {
    if (g_.rules.size() >= limits_.max_rules) {
      fail(at, "more than max_rules (" + std::to_string(limits_.max_rules) +
                   ") rules, counting those groups and repetitions generate");
    }
    ParsedRule r;
    r.name = std::move(name);
    r.offset = at;
    r.first_use = at;
    g_.rules.push_back(std::move(r));
    return static_cast<uint32_t>(g_.rules.size() - 1);
  }

  uint32_t rule_id(const std::string& name, size_t at) {
    auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    const uint32_t id = add_rule(name, at);
    ids_.emplace(name, id);
    return id;
  }

  // A generated rule for a group or repetition inside `owner` (named for error messages).
  // Its symbols are counted by whoever made them (add_symbols).
  uint32_t generated_rule(size_t at, std::vector<std::vector<Symbol>> alts) {
    const uint32_t id = add_rule(owner_ + "_" + std::to_string(++generated_), at);
    g_.rules[id].alts = std::move(alts);
    g_.rules[id].defined = true;
    return id;
  }

  // Every symbol and end of alternative is counted when it is made, so a grammar is refused
  // before it takes more memory than max_elements allows.
  void add_symbols(size_t n, size_t at) {
    n_symbols_ += n;
    if (n_symbols_ > limits_.max_elements) {
      fail(at, "more than max_elements (" + std::to_string(limits_.max_elements) +
                   ") symbols, counting those repetitions generate");
    }
  }

  void push(std::vector<Symbol>& seq, Symbol sym, size_t at) {
    add_symbols(1, at);
    seq.push_back(sym);
  }

  void parse_rule() {
    const size_t at = p_;
    std::string name = parse_name();
    skip_space(false);
    if (s_.substr(p_, 3) != "::=") fail(p_, "expected '::=' after rule name '" + name + "'");
    p_ += 3;
    skip_space(true);
    const uint32_t id = rule_id(name, at);
    if (g_.rules[id].defined) {
      fail(at, "rule '" + name + "' is defined twice");
    }
    owner_ = name;
    generated_ = 0;
    g_.rules[id].defined = true;  // before the body: a self-reference is not "undefined"
    g_.rules[id].offset = at;
    g_.rules[id].alts = parse_alternates(0);
    if (!at_end()) {
      if (!at_newline()) fail(p_, std::string("unexpected '") + peek() + "' (expected a newline)");
      ++p_;
    }
  }

  std::vector<std::vector<Symbol>> parse_alternates(size_t depth) {
    if (depth > limits_.max_nesting) {
      fail(p_, "parentheses nested deeper than max_nesting (" +
                   std::to_string(limits_.max_nesting) + ")");
    }
    std::vector<std::vector<Symbol>> alts;
    for (;;) {
      add_symbols(1, p_);  // the end of the alternative
      alts.push_back(parse_sequence(depth));
      if (peek() != '|') break;
      ++p_;
      skip_space(true);
    }
    return alts;
  }

  std::vector<Symbol> parse_sequence(size_t depth) {
    std::vector<Symbol> seq;
    size_t last = 0;  // where the last item starts in seq (for a postfix operator)
    bool have_item = false;
    for (;;) {
      skip_space(depth > 0);
      if (at_end()) break;
      const char c = peek();
      const size_t at = p_;
      if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
      if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (!have_item) fail(at, std::string("'") + c + "' has nothing before it to repeat");
        auto [min, max] = parse_repeat_bounds();
        std::vector<Symbol> item(seq.begin() + static_cast<ptrdiff_t>(last), seq.end());
        seq.resize(last);
        repeat(item, min, max, at, seq);
        continue;
      }
      last = seq.size();
      have_item = true;
      if (c == '"') {
        parse_literal(seq);
      } else if (c == '[') {
        parse_class(seq);
      } else if (c == '.') {
        ++p_;
        push(seq, {false, add_class({}, true)}, at);
      } else if (c == '(') {
        ++p_;
        skip_space(true);
        auto alts = parse_alternates(depth + 1);
        if (peek() != ')') fail(p_, "expected ')'");
        ++p_;
        push(seq, {true, generated_rule(at, std::move(alts))}, at);
      } else if (is_name_char(c)) {
        const std::string name = parse_name();
        push(seq, {true, rule_id(name, at)}, at);
      } else if (c == '<' || c == '!') {
        fail(at, "token references (<...>) are not supported");
      } else {
        fail(at, std::string("unexpected '") + c + "'");
      }
    }
    return seq;
  }

  size_t parse_int(const char* what) {
    const size_t b = p_;
    size_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<size_t>(peek() - '0');
      ++p_;
      if (v > limits_.max_repeat) {
        fail(b, std::string(what) + " is more than max_repeat (" +
                    std::to_string(limits_.max_repeat) + ")");
      }
    }
    return v;
  }

  // The bounds of *, +, ?, {m}, {m,}, {m,n}, {,n}; max == SIZE_MAX: no upper bound.
  std::pair<size_t, size_t> parse_repeat_bounds() {
    const char c = peek();
    ++p_;
    if (c == '*') return {0, SIZE_MAX};
    if (c == '+') return {1, SIZE_MAX};
    if (c == '?') return {0, 1};
    const size_t open = p_ - 1;
    skip_space(false);
    const bool has_min = peek() >= '0' && peek() <= '9';
    const size_t min = has_min ? parse_int("the repetition minimum") : 0;
    skip_space(false);
    size_t max = min;
    if (peek() == ',') {
      ++p_;
      skip_space(false);
      max = (peek() >= '0' && peek() <= '9') ? parse_int("the repetition maximum") : SIZE_MAX;
      skip_space(false);
    } else if (!has_min) {
      fail(p_, "expected a number in '{...}'");
    }
    if (peek() != '}') fail(p_, "expected '}' to close the repetition");
    ++p_;
    if (max < min) fail(open, "repetition maximum is less than its minimum");
    return {min, max};
  }

  // Appends item{min,max} to seq: the item becomes one symbol (a rule when it has several), then
  // min copies, then a right-recursive rule for the optional rest (nested, so x{0,3} reads each
  // character one way only).
  void repeat(const std::vector<Symbol>& item, size_t min, size_t max, size_t at,
              std::vector<Symbol>& seq) {
    if (item.empty()) return;  // "" repeated is still ""
    // The item's symbols move out of seq (counted already); a wrapper adds its end.
    n_symbols_ -= item.size();
    Symbol unit = item[0];
    if (item.size() != 1) {
      add_symbols(item.size() + 1, at);
      unit = Symbol{true, generated_rule(at, {item})};
    }
    add_symbols(min, at);
    seq.insert(seq.end(), min, unit);
    if (max == SIZE_MAX) {
      // star ::= unit star | ""   (the self-reference is filled in once the id is known)
      add_symbols(5, at);
      const uint32_t star = generated_rule(at, {{unit, unit}, {}});
      g_.rules[star].alts[0][1] = Symbol{true, star};
      seq.push_back({true, star});
      return;
    }
    if (max == min) return;
    add_symbols(4, at);
    uint32_t tail = generated_rule(at, {{unit}, {}});  // unit?
    for (size_t k = 1; k < max - min; ++k) {
      add_symbols(4, at);
      tail = generated_rule(at, {{unit, {true, tail}}, {}});
    }
    seq.push_back({true, tail});
  }

  uint32_t char_class(char32_t cp) {  // literal characters share one class per code point
    auto [it, fresh] = single_.emplace(cp, 0);
    if (fresh) it->second = add_class({{cp, cp}}, false);
    return it->second;
  }

  uint32_t add_class(std::vector<std::pair<char32_t, char32_t>> ranges, bool negated) {
    g_.classes.push_back(make_char_class(std::move(ranges), negated));
    return static_cast<uint32_t>(g_.classes.size() - 1);
  }

  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  char32_t parse_char() {
    const size_t at = p_;
    if (at_end()) fail(at, "unexpected end of input");
    const auto b0 = static_cast<unsigned char>(peek());
    if (b0 == '\\') {
      ++p_;
      const char e = peek();
      ++p_;
      switch (e) {
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case 't':
          return '\t';
        case '\\':
          return '\\';
        case '"':
          return '"';
        case '[':
          return '[';
        case ']':
          return ']';
        case 'x':
          return parse_hex(2, at);
        case 'u':
          return parse_hex(4, at);
        case 'U':
          return parse_hex(8, at);
        default:
          if (e == '\0' && at_end()) fail(at, "unexpected end of input after '\\'");
          fail(at, std::string("unknown escape '\\") + e + "'");
      }
    }
    // UTF-8: the grammar text itself must be valid.
    int n = b0 < 0x80             ? 1
            : (b0 & 0xE0) == 0xC0 ? 2
            : (b0 & 0xF0) == 0xE0 ? 3
            : (b0 & 0xF8) == 0xF0 ? 4
                                  : 0;
    if (n == 0 || p_ + static_cast<size_t>(n) > s_.size()) fail(at, "invalid UTF-8");
    char32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int i = 1; i < n; ++i) {
      const auto b = static_cast<unsigned char>(s_[p_ + static_cast<size_t>(i)]);
      if ((b & 0xC0) != 0x80) fail(at, "invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > kMaxCodePoint || (cp >= 0xD800 && cp <= 0xDFFF)) {
      fail(at, "invalid UTF-8");
    }
    p_ += static_cast<size_t>(n);
    return cp;
  }

  char32_t parse_hex(int digits, size_t at) {
    char32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = hex_value(peek());
      if (h < 0) fail(at, "expected " + std::to_string(digits) + " hex digits after the escape");
      v = v * 16 + static_cast<char32_t>(h);
      ++p_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) fail(at, "escape is not a code point");
    return v;
  }

  void parse_literal(std::vector<Symbol>& seq) {
    const size_t open = p_++;
    for (;;) {
      if (at_end()) fail(open, "unterminated string literal");
      if (peek() == '"') break;
      const size_t at = p_;
      const char32_t cp = parse_char();
      push(seq, {false, char_class(cp)}, at);
    }
    ++p_;
  }

  void parse_class(std::vector<Symbol>& seq) {
    const size_t open = p_++;
    const bool negated = peek() == '^';
    if (negated) ++p_;
    std::vector<std::pair<char32_t, char32_t>> ranges;
    for (;;) {
      if (at_end()) fail(open, "unterminated character class");
      if (peek() == ']') break;
      const size_t at = p_;
      const char32_t lo = parse_char();
      char32_t hi = lo;
      if (peek() == '-' && peek(1) != ']' && p_ + 1 < s_.size()) {
        ++p_;
        hi = parse_char();
        if (hi < lo) fail(at, "character range is reversed");
      }
      ranges.emplace_back(lo, hi);
    }
    ++p_;
    push(seq, {false, add_class(std::move(ranges), negated)}, open);
  }

  std::string_view s_;
  const GrammarLimits& limits_;
  size_t p_ = 0;
  ParsedGrammar g_;
  std::unordered_map<std::string, uint32_t> ids_;
  std::unordered_map<char32_t, uint32_t> single_;
  std::string owner_;
  size_t generated_ = 0;
  size_t n_symbols_ = 0;
};

}  // namespace

ParsedGrammar parse_gbnf(std::string_view text, const GrammarLimits& limits) {
  return Parser(text, limits).run();
}

}  // namespace moe::grammar
