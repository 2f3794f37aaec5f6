// The compiled form of a GBNF grammar (internal to coordinator/grammar): every rule is a flat run
// of elements over Unicode code points in one array, so a parse position is one index.
//
//   rule r:  alt_0 elements, Alt, alt_1 elements, Alt, ..., alt_k elements, End
//
// An element is a character class (one code point out of sorted ranges), a reference to a rule,
// or the end of an alternative (Alt or End: the rule is complete there). Literal characters,
// negated classes and `.` are all stored as positive ranges.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace moe::grammar {

enum class Op : uint8_t {
  End,    // end of the last alternative of a rule
  Alt,    // end of an alternative, another follows
  Rule,   // arg: the rule referenced
  Class,  // arg: index into GrammarImpl::classes
};

struct Element {
  Op op;
  uint32_t arg;
};

inline constexpr char32_t kMaxCodePoint = 0x10FFFF;

// A set of code points as sorted, disjoint, non-adjacent inclusive ranges (negation already
// applied), plus a bitmap of its ASCII members for the common case.
struct CharClass {
  std::vector<std::pair<char32_t, char32_t>> ranges;
  uint64_t ascii[2] = {0, 0};

  bool matches(char32_t cp) const {
    if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
    auto it = std::upper_bound(ranges.begin(), ranges.end(), cp,
                               [](char32_t c, const auto& r) { return c < r.first; });
    return it != ranges.begin() && cp <= std::prev(it)->second;
  }
  // Some member lies in [lo, hi] (a partial UTF-8 character could still become one).
  bool intersects(char32_t lo, char32_t hi) const {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), hi,
                               [](char32_t c, const auto& r) { return c < r.first; });
    return it != ranges.begin() && std::prev(it)->second >= lo;
  }
  // Every code point in [lo, hi] is a member.
  bool contains(char32_t lo, char32_t hi) const {
    auto it = std::upper_bound(ranges.begin(), ranges.end(), lo,
                               [](char32_t c, const auto& r) { return c < r.first; });
    return it != ranges.begin() && std::prev(it)->second >= hi;
  }
};

// Sorts and merges raw ranges, applies the negation, fills the ASCII bitmap.
CharClass make_char_class(std::vector<std::pair<char32_t, char32_t>> ranges, bool negated);

class GrammarImpl {
 public:
  std::vector<Element> elements;                 // all rules, one after the other
  std::vector<uint32_t> rule_begin;              // first element of each rule
  std::vector<std::vector<uint32_t>> alt_begin;  // first element of each alternative, per rule
  std::vector<std::string> rule_names;           // generated rules are named `<user rule>_<n>`
  std::vector<CharClass> classes;
  uint32_t root = 0;

  bool ends_alternative(uint32_t pos) const {
    return elements[pos].op == Op::End || elements[pos].op == Op::Alt;
  }
};

}  // namespace moe::grammar
