// Matching text: every GBNF construct accepted and refused on strings, exact repetition bounds,
// UTF-8 (also split across accept_bytes calls), and the ambiguity limit.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"
#include "coordinator/grammar/grammar.h"

namespace moe::grammar {
namespace {

struct Case {
  const char* gbnf;
  std::vector<std::string> yes, no;
};

void check(const Case& c) {
  const auto g = Grammar::parse(c.gbnf);
  for (const auto& s : c.yes) EXPECT_TRUE(matches(g, s)) << c.gbnf << "  on  '" << s << "'";
  for (const auto& s : c.no) EXPECT_FALSE(matches(g, s)) << c.gbnf << "  on  '" << s << "'";
}

TEST(GrammarMatch, Constructs) {
  const Case cases[] = {
      {"root ::= \"abc\"", {"abc"}, {"", "ab", "abcd", "abd", "ABC"}},
      {"root ::= \"\"", {""}, {"a"}},
      {"root ::= \"a\" | \"bc\" | \"\"", {"a", "bc", ""}, {"b", "abc", "c"}},
      {"root ::= \"a\" (\"b\" | \"c\") \"d\"", {"abd", "acd"}, {"ad", "abcd"}},
      {"root ::= [a-c0-2_]", {"a", "b", "c", "0", "2", "_"}, {"d", "3", "A", "", "ab"}},
      {"root ::= [^a-c\"]", {"d", "A", "é", "😀"}, {"a", "c", "\"", ""}},
      {"root ::= .", {"a", "\n", "é", "😀", std::string(1, '\0')}, {"", "ab"}},
      {"root ::= \"a\"*", {"", "a", "aaaaa"}, {"b", "ab"}},
      {"root ::= \"ab\"+", {"ab", "abab"}, {"", "a", "aba"}},
      {"root ::= \"a\"? \"b\"", {"b", "ab"}, {"aab", "a"}},
      {"root ::= x x\nx ::= \"x\" | \"y\"", {"xx", "xy", "yx", "yy"}, {"x", "xxx"}},
      {"root ::= \"\\n\\t\\\\\\\"\\x41\\u00e9\\U0001F600\"", {"\n\t\\\"Aé😀"}, {"\n\t\\\"Ae😀"}},
      {"root ::= [\\[\\]] [\\x30-\\x39]", {"[0", "]9"}, {"a0", "[a"}},
      {"root ::= [a-] [-a]", {"a-", "-a", "--", "aa"}, {"b-"}},
      {"root ::= \"(\" root \")\" | \"\"", {"", "()", "(())", "((()))"}, {"(", "())", ")("}},
      {"root ::= item (\",\" item)*\nitem ::= [0-9]+", {"1", "12,3,456"}, {"", "1,", ",1", "1,,2"}},
      {"root ::= ( # comment\n  \"a\"\n  | \"b\"\n)", {"a", "b"}, {"ab"}},
      {"root ::= (\"a\" | \"ab\") \"c\"", {"ac", "abc"}, {"abbc"}},  // ambiguous prefix
      {"root ::= ((\"a\")*)?", {"", "a", "aa"}, {"b"}},
      {"root ::= [] | \"x\"", {"x"}, {"", "a"}},
      {"root ::= \"\"* \"a\" \"\"{2,3} \"\"?", {"a"}, {"", "aa"}},  // repeating nothing
  };
  for (const auto& c : cases) check(c);
}

TEST(GrammarMatch, RepetitionBoundsExact) {
  auto count = [](const char* gbnf, size_t n) {
    return matches(Grammar::parse(gbnf), std::string(n, 'a'));
  };
  for (size_t n = 0; n <= 7; ++n) {
    EXPECT_EQ(count("root ::= \"a\"{3}", n), n == 3) << n;
    EXPECT_EQ(count("root ::= \"a\"{2,4}", n), n >= 2 && n <= 4) << n;
    EXPECT_EQ(count("root ::= \"a\"{2,}", n), n >= 2) << n;
    EXPECT_EQ(count("root ::= \"a\"{,3}", n), n <= 3) << n;
    EXPECT_EQ(count("root ::= \"a\"{0}", n), n == 0) << n;
    EXPECT_EQ(count("root ::= (\"a\" | \"aa\"){2,3}", n), n >= 2 && n <= 6) << n;
  }
  // Over a group of several symbols: the whole group repeats.
  const auto g = Grammar::parse("root ::= \"ab\"{2,3}");
  EXPECT_FALSE(matches(g, "ab"));
  EXPECT_TRUE(matches(g, "abab"));
  EXPECT_TRUE(matches(g, "ababab"));
  EXPECT_FALSE(matches(g, "abababab"));
  EXPECT_FALSE(matches(g, "abb"));
  // Large bounds stay linear (the optional part is nested, not 1000 ambiguous choices).
  const auto big = Grammar::parse("root ::= [a-z]{10,1000}");
  EXPECT_TRUE(matches(big, std::string(1000, 'q')));
  EXPECT_FALSE(matches(big, std::string(1001, 'q')));
  EXPECT_FALSE(matches(big, std::string(9, 'q')));
}

TEST(GrammarMatch, Utf8) {
  check({"root ::= \"héllo 😀\"", {"héllo 😀"}, {"hello 😀", "héllo 😁", "héllo "}});
  check({"root ::= [α-ω]+", {"αβγ", "ω"}, {"a", "Α", "αa"}});
  check({"root ::= [^α-ω]", {"a", "Α", "😀", "é"}, {"β", ""}});
  check({"root ::= [😀-😂é]", {"😀", "😁", "😂", "é"}, {"😃", "e"}});
  // Invalid UTF-8 is refused, never matched by `.` or a negated class.
  const auto any = Grammar::parse("root ::= .*");
  for (const char* bad :
       {"\xff", "\xc0\x80", "\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80", "\xc3"}) {
    EXPECT_FALSE(matches(any, bad)) << bad;
  }
}

TEST(GrammarMatch, PartialUtf8AcrossCalls) {
  const auto g = Grammar::parse("root ::= \"é\" [😀-😂]");
  GrammarMatcher m(g, nullptr);
  const std::string e = "é", smile = "😁";
  EXPECT_TRUE(m.accept_bytes(e.substr(0, 1)));  // a lead byte that can become é
  EXPECT_FALSE(m.can_end());
  EXPECT_FALSE(m.accept_bytes("\xa8"));  // é is C3 A9: C3 A8 (è) is refused
  EXPECT_TRUE(m.accept_bytes(e.substr(1) + smile.substr(0, 2)));
  EXPECT_FALSE(m.accept_bytes("\x98\x83"));  // 😃 is outside the class
  EXPECT_TRUE(m.accept_bytes(smile.substr(2, 1)));
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes(smile.substr(3)));
  EXPECT_TRUE(m.can_end());
  EXPECT_TRUE(m.must_end());

  // A lead byte no allowed character starts with is refused at once.
  GrammarMatcher ascii(Grammar::parse("root ::= [a-z]"), nullptr);
  EXPECT_FALSE(ascii.accept_bytes("\xc3"));
  GrammarMatcher not_ascii(Grammar::parse("root ::= [^a-z]"), nullptr);
  EXPECT_TRUE(not_ascii.accept_bytes("\xc3"));
}

TEST(GrammarMatch, StateUnchangedOnRefusal) {
  GrammarMatcher m(Grammar::parse("root ::= \"abc\" | \"abd\""), nullptr);
  EXPECT_TRUE(m.accept_bytes("ab"));
  EXPECT_FALSE(m.accept_bytes("x"));
  EXPECT_FALSE(m.accept_bytes("cx"));  // the c is not kept
  EXPECT_TRUE(m.accept_bytes("d"));
  EXPECT_TRUE(m.can_end());
  EXPECT_THROW(m.allowed(), moe::Error);  // no vocabulary
}

TEST(GrammarMatch, CanEndAndMustEnd) {
  GrammarMatcher m(Grammar::parse("root ::= \"a\" \"b\"?"), nullptr);
  EXPECT_FALSE(m.can_end());
  EXPECT_TRUE(m.accept_bytes("a"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.must_end());
  EXPECT_TRUE(m.accept_bytes("b"));
  EXPECT_TRUE(m.must_end());
}

TEST(GrammarMatch, AmbiguityLimitIsAnErrorNotAHang) {
  // Each x can be read as a, b or c, and the choices never merge: the stacks multiply.
  const char* gbnf =
      "root ::= (a | b | c)*\na ::= \"x\" a2\na2 ::= \"y\" | \"\"\nb ::= \"x\"\nc ::= \"x\"";
  EXPECT_TRUE(matches(Grammar::parse(gbnf), std::string(500, 'x')));  // merged stacks: fine
  // A grammar whose parses stay apart: (x | xx)* (y | "")... nested copies of a rule that
  // remembers where it started.
  GrammarLimits l;
  l.max_stacks = 64;
  const auto g =
      Grammar::parse("root ::= p*\np ::= \"(\" p* \")\" | \"(\" p* \")\" \"!\"?\n", "root", l);
  GrammarMatcher m(g, nullptr);
  bool threw = false;
  try {
    for (int i = 0; i < 200 && m.accept_bytes("("); ++i) {
    }
  } catch (const moe::Error& e) {
    threw = true;
    EXPECT_NE(std::string(e.what()).find("too ambiguous"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(threw);
}

TEST(GrammarMatch, RightRecursionStaysFlat) {
  // A long sequence under x* must not build a stack per character.
  const auto g = Grammar::parse("root ::= (\"a\" | \"b\")* \"c\"");
  std::string s(200000, 'a');
  s += 'c';
  EXPECT_TRUE(matches(g, s));
}

}  // namespace
}  // namespace moe::grammar

namespace moe::grammar {
namespace {

TEST(GrammarMatch, DeepNestingAndMachineRebuild) {
  // Every depth is a new state: past its bound (2^16 states) the matcher's machine is rebuilt
  // from the current state between calls, and the rebuilt state goes on correctly.
  const auto g = Grammar::parse("root ::= \"(\" root \")\" | \"x\"");
  GrammarMatcher m(g, nullptr);
  const size_t depth = 70000;
  ASSERT_TRUE(m.accept_bytes(std::string(depth, '(')));
  ASSERT_TRUE(m.accept_bytes("x"));  // rebuilt here
  ASSERT_FALSE(m.accept_bytes("x"));
  ASSERT_TRUE(m.accept_bytes(std::string(depth - 1, ')')));
  EXPECT_FALSE(m.can_end());
  ASSERT_TRUE(m.accept_bytes(")"));
  EXPECT_TRUE(m.must_end());
  EXPECT_FALSE(m.accept_bytes(")"));
}

}  // namespace
}  // namespace moe::grammar
