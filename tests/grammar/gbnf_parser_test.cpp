// The GBNF parser: what it accepts, and each error it reports with its line and column.
#include <gtest/gtest.h>

#include <string>

#include "common/error.h"
#include "coordinator/grammar/grammar.h"

namespace moe::grammar {
namespace {

// The message of the moe::Error that parsing `gbnf` throws ("" when it parses).
std::string parse_error(const std::string& gbnf, const GrammarLimits& limits = {}) {
  try {
    Grammar::parse(gbnf, "root", limits);
  } catch (const moe::Error& e) {
    return e.what();
  }
  return "";
}

TEST(GrammarParser, AcceptsEveryConstruct) {
  const char* ok[] = {
      "root ::= \"a\"",
      "root ::= \"a\"\n",
      "root ::= \"\"",
      "root ::=",
      "root ::= [a-z0-9_] | [^\"\\\\] | . | \"x\"* \"y\"+ \"z\"?",
      "root ::= x{2} x{2,} x{2,4} x{,3} x{ 1 , 2 }\nx ::= \"x\"",
      "# comment\nroot ::= a # trailing\n\n# more\na ::= \"a\" | \"b\"\n",
      "root ::= (\n  \"a\"\n  | \"b\"  # inside a group\n)\n",
      "root ::= \"a\" |\n  \"b\"",
      "root ::=\n  \"a\"",
      "root ::= \"\\n\\r\\t\\\\\\\"\\[\\]\\x41\\u00e9\\U0001F600\"",
      "root ::= [\\x00-\\x1f\\]\\[-] [a-] [-a]",
      "root ::= \"é😀\" [α-ω] [^é]",
      "root ::= Word-2\nWord-2 ::= \"w\"",
      "root ::= ((\"a\")*)? \"b\"",
      "root ::= \"a\"\r\nx ::= \"b\"\r\n",
      "root ::= [] [^]",
  };
  for (const char* g : ok) EXPECT_EQ(parse_error(g), "") << g;
}

struct ErrorCase {
  const char* gbnf;
  const char* message;  // the whole message
};

TEST(GrammarParser, RefusesWithLineAndColumn) {
  const ErrorCase cases[] = {
      {"root ::= \"a", "grammar: line 1, column 10: unterminated string literal"},
      {"root ::= [a-z", "grammar: line 1, column 10: unterminated character class"},
      {"root ::= \"a\"\nfoo \"b\"",
       "grammar: line 2, column 5: expected '::=' after rule name 'foo'"},
      {"root ::= ( \"a\"", "grammar: line 1, column 15: expected ')'"},
      {"root ::= \"a\" )", "grammar: line 1, column 14: unexpected ')' (expected a newline)"},
      {"root ::= * \"a\"", "grammar: line 1, column 10: '*' has nothing before it to repeat"},
      {"root ::= \"a\"{3,2}",
       "grammar: line 1, column 13: repetition maximum is less than its minimum"},
      {"root ::= \"a\"{x}", "grammar: line 1, column 14: expected a number in '{...}'"},
      {"root ::= \"a\"{2", "grammar: line 1, column 15: expected '}' to close the repetition"},
      {"root ::= \"\\q\"", "grammar: line 1, column 11: unknown escape '\\q'"},
      {"root ::= \"\\x4\"", "grammar: line 1, column 11: expected 2 hex digits after the escape"},
      {"root ::= \"\\uD800\"", "grammar: line 1, column 11: escape is not a code point"},
      {"root ::= [z-a]", "grammar: line 1, column 11: character range is reversed"},
      {"root ::= \"é\" @", "grammar: line 1, column 14: unexpected '@'"},
      {"root ::= \"\xff\"", "grammar: line 1, column 11: invalid UTF-8"},
      {"root ::= <[1234]>",
       "grammar: line 1, column 10: token references (<...>) are not supported"},
      {"root ::= a\n\nb ::= \"b\"\n", "grammar: line 1, column 10: undefined rule 'a'"},
      {"a ::= \"a\"", "grammar: no rule 'root'"},
      {"", "grammar: no rule 'root'"},
      {"root ::= \"a\"\nroot ::= \"b\"", "grammar: line 2, column 1: rule 'root' is defined twice"},
      {"root ::= \"a\"\n::= \"b\"", "grammar: line 2, column 1: expected a rule name"},
  };
  for (const auto& c : cases) EXPECT_EQ(parse_error(c.gbnf), c.message) << c.gbnf;
}

TEST(GrammarParser, RefusesLeftRecursion) {
  EXPECT_EQ(parse_error("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\""),
            "grammar: line 2, column 1: rule 'expr' is left-recursive (it can reach itself before "
            "reading a character)");
  // Indirect.
  EXPECT_NE(parse_error("root ::= a\na ::= b \"x\"\nb ::= a \"y\" | \"z\"").find("left-recursive"),
            std::string::npos);
  // Through a nullable prefix.
  EXPECT_EQ(parse_error("root ::= ws root \"x\" | \"y\"\nws ::= [ ]*"),
            "grammar: line 1, column 1: rule 'root' is left-recursive (it can reach itself before "
            "reading a character)");
  // A repetition of something that can be empty would loop the same way.
  EXPECT_NE(parse_error("root ::= (\"a\"?)*").find("rule 'root' is left-recursive"),
            std::string::npos);
  // Right recursion is fine.
  EXPECT_EQ(parse_error("root ::= \"a\" root | \"\""), "");
}

TEST(GrammarParser, RefusesEveryLimit) {
  GrammarLimits l;
  l.max_text_bytes = 10;
  EXPECT_EQ(parse_error("root ::= \"abc\"", l),
            "grammar: the text is 14 bytes, more than max_text_bytes (10)");
  l = {};
  l.max_nesting = 3;
  EXPECT_EQ(parse_error("root ::= (((\"a\")))", l), "");
  EXPECT_EQ(parse_error("root ::= ((((\"a\"))))", l),
            "grammar: line 1, column 14: parentheses nested deeper than max_nesting (3)");
  l = {};
  l.max_repeat = 100;
  EXPECT_EQ(parse_error("root ::= \"a\"{100}", l), "");
  EXPECT_EQ(parse_error("root ::= \"a\"{101}", l),
            "grammar: line 1, column 14: the repetition minimum is more than max_repeat (100)");
  EXPECT_EQ(parse_error("root ::= \"a\"{1,99999999999999999999999}", l),
            "grammar: line 1, column 16: the repetition maximum is more than max_repeat (100)");
  l = {};
  l.max_rules = 4;
  EXPECT_EQ(parse_error("root ::= \"a\"{0,3}", l), "");  // root + 3 optional rules
  EXPECT_NE(parse_error("root ::= \"a\"{0,4}", l).find("more than max_rules (4) rules"),
            std::string::npos);
  l = {};
  l.max_elements = 50;
  EXPECT_EQ(parse_error("root ::= \"a\"{40}", l), "");
  EXPECT_EQ(parse_error("root ::= \"a\"{60}", l),
            "grammar: line 1, column 13: more than max_elements (50) symbols, counting those "
            "repetitions generate");
  // Deep nesting from untrusted text is bounded, not a stack overflow.
  EXPECT_NE(parse_error("root ::= " + std::string(100000, '(')).find("max_nesting (64)"),
            std::string::npos);
}

TEST(GrammarParser, OtherRootName) {
  EXPECT_NO_THROW(Grammar::parse("start ::= \"a\"", "start"));
  try {
    Grammar::parse("start ::= \"a\"", "main");
    FAIL();
  } catch (const moe::Error& e) {
    EXPECT_STREQ(e.what(), "grammar: no rule 'main'");
  }
}

}  // namespace
}  // namespace moe::grammar
