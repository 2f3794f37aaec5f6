// Masks: the prefix-tree walk gives exactly the tokens a brute-force check (accept_bytes on a copy,
// token by token) allows, on a small synthetic vocabulary and on the real Qwen3 vocabulary, in
// random states of random generations; cached masks are identical to computed ones.
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/grammar/grammar.h"
#include "coordinator/tokenizer/tokenizer.h"
#include "tests/testdata.h"

namespace moe::grammar {
namespace {

using Kind = TokenBytes::Kind;

bool bit(std::span<const uint64_t> mask, int32_t id) { return (mask[id >> 6] >> (id & 63)) & 1; }

// Token by token: a Text token with bytes is allowed when a copy of the matcher accepts its
// bytes; an Eog token when the matcher can end; a Never token never. `m` should be a matcher that
// never computed a mask (a shadow of the one under test), so that copying it is cheap.
std::vector<uint64_t> brute_force(const GrammarMatcher& m, const TokenBytes& v) {
  std::vector<uint64_t> mask((static_cast<size_t>(v.size()) + 63) / 64, 0);
  GrammarMatcher probe(m);
  for (int32_t id = 0; id < v.size(); ++id) {
    bool ok = false;
    if (v.kind(id) == Kind::Eog) {
      ok = m.can_end();
    } else if (v.kind(id) == Kind::Text && !v.bytes(id).empty()) {
      ok = probe.accept_bytes(v.bytes(id));
      if (ok) probe = GrammarMatcher(m);  // back to the state under test
    }
    if (ok) mask[static_cast<size_t>(id) >> 6] |= 1ull << (id & 63);
  }
  return mask;
}

// Positions where the two masks differ, as text for the failure message.
std::string diff(std::span<const uint64_t> got, std::span<const uint64_t> want,
                 const TokenBytes& v) {
  std::string out;
  int shown = 0;
  for (int32_t id = 0; id < v.size() && shown < 10; ++id) {
    if (bit(got, id) != bit(want, id)) {
      out += " token " + std::to_string(id) + " '" + std::string(v.bytes(id)) +
             "' mask=" + std::to_string(bit(got, id)) + ";";
      ++shown;
    }
  }
  return out;
}

int32_t pick_allowed(std::span<const uint64_t> mask, int32_t n, std::mt19937& rng) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n; ++id) {
    if (bit(mask, id)) ids.push_back(id);
  }
  if (ids.empty()) return -1;
  return ids[std::uniform_int_distribution<size_t>(0, ids.size() - 1)(rng)];
}

// A small vocabulary: every 1- and 2-byte string over an alphabet that matters to the grammars,
// UTF-8 characters whole and split, plus end, control and empty tokens.
std::shared_ptr<const TokenBytes> synthetic_vocab() {
  const std::string alphabet = "ab01{}[]\":, \\-.ex";
  std::vector<std::string> bytes;
  std::vector<Kind> kinds;
  auto add = [&](std::string b, Kind k = Kind::Text) {
    bytes.push_back(std::move(b));
    kinds.push_back(k);
  };
  for (char c : alphabet) add(std::string(1, c));
  for (char c : alphabet) {
    for (char d : alphabet) add(std::string{c, d});
  }
  for (const std::string s : {"é", "😀", "ß", "\"é", "é\"", "true", "null", "false", "\"a\":", "12"})
    add(s);
  for (const std::string s : {"é", "😀", "€"}) {
    for (size_t cut = 1; cut < s.size(); ++cut) {
      add(s.substr(0, cut));
      add(s.substr(cut));
      std::string with_a = "a";  // (not "a" + ...: GCC 12 -O3 warns wrongly, -Wrestrict)
      with_a.append(s, 0, cut);
      add(with_a);
    }
  }
  add("\xff");
  add("", Kind::Text);  // empty: never allowed
  add("<|end|>", Kind::Eog);
  add("<|ctl|>", Kind::Never);
  add("a", Kind::Text);  // a duplicate of another token's bytes
  return std::make_shared<TokenBytes>(std::move(bytes), std::move(kinds));
}

const char* kJson = R"(root ::= ws value ws
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,3} )?
ws ::= [ \t\n]{0,4}
)";

const char* kSynthGrammars[] = {
    kJson,
    "root ::= ( \"a\" | \"é\" | [😀-😂] | \"ab\" \"-\"? )* \"x\"",
    "root ::= [^\"\\\\]{0,5} \"\\\"\" | \"e\"{2,4} | ([0-9] [a-b])+",
    "root ::= x x x\nx ::= \"a\" | \"ab\" | \"b\" | \"\"",
};

TEST(GrammarMask, SyntheticVocabularyMatchesBruteForce) {
  const auto vocab = synthetic_vocab();
  std::mt19937 rng(1234);
  for (const char* gbnf : kSynthGrammars) {
    const auto g = Grammar::parse(gbnf);
    for (int run = 0; run < 6; ++run) {
      GrammarMatcher m(g, vocab), shadow(g, vocab);
      for (int step = 0; step < 25; ++step) {
        const auto mask = m.allowed();
        const std::vector<uint64_t> got(mask.begin(), mask.end());
        const auto want = brute_force(shadow, *vocab);
        ASSERT_EQ(got, want) << gbnf << " step " << step << diff(got, want, *vocab);
        const int32_t t = pick_allowed(got, vocab->size(), rng);
        if (t < 0 || vocab->kind(t) == Kind::Eog) break;
        m.accept(t);
        shadow.accept(t);
      }
    }
  }
}

TEST(GrammarMask, NeverEmptyAndEndTokens) {
  const auto vocab = synthetic_vocab();
  const int32_t n = vocab->size();
  GrammarMatcher m(Grammar::parse("root ::= \"a\" \"b\"?"), vocab);
  // The vocabulary ends: "", <|end|>, <|ctl|>, "a" (a duplicate).
  const int32_t empty = n - 4, end = n - 3, ctl = n - 2, dup_a = n - 1;
  auto mask = m.allowed();
  EXPECT_FALSE(bit(mask, end));  // not yet
  EXPECT_FALSE(bit(mask, ctl));
  EXPECT_FALSE(bit(mask, empty));
  EXPECT_TRUE(bit(mask, dup_a));
  EXPECT_THROW(m.accept(end), moe::Error);
  EXPECT_THROW(m.accept(ctl), moe::Error);
  EXPECT_THROW(m.accept(empty), moe::Error);
  m.accept(dup_a);
  mask = m.allowed();
  EXPECT_TRUE(bit(mask, end));
  m.accept(end);
  EXPECT_THROW(m.accept(dup_a), moe::Error);
  for (uint64_t w : m.allowed()) EXPECT_EQ(w, 0u);  // nothing after the end
}

TEST(GrammarMask, CacheHitIsIdentical) {
  const auto vocab = synthetic_vocab();
  const auto g = Grammar::parse(kJson);
  GrammarMatcher m(g, vocab);
  ASSERT_TRUE(m.accept_bytes("{\"a"));
  const auto first = std::vector<uint64_t>(m.allowed().begin(), m.allowed().end());
  const auto again = std::vector<uint64_t>(m.allowed().begin(), m.allowed().end());
  EXPECT_EQ(first, again);
  // Inside a string the state repeats after each character: the cached mask must equal the one a
  // fresh matcher computes there.
  for (const char* more : {"b", "0", "ab", "\\n"}) {
    ASSERT_TRUE(m.accept_bytes(more));
    const auto cached = std::vector<uint64_t>(m.allowed().begin(), m.allowed().end());
    GrammarMatcher fresh(g, vocab);
    ASSERT_TRUE(fresh.accept_bytes(std::string("{\"a") + more));
    const auto computed = std::vector<uint64_t>(fresh.allowed().begin(), fresh.allowed().end());
    EXPECT_EQ(cached, computed) << more;
    EXPECT_EQ(cached, first) << more;
  }
}

// The real vocabulary: Qwen3's 151,936 tokens, control tokens never allowed.
std::shared_ptr<const TokenBytes> qwen_vocab(const moe::tokenizer::Tokenizer& tok) {
  std::vector<std::string> bytes;
  std::vector<Kind> kinds;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    bytes.push_back(tok.token_piece(id, true));
    if (tok.is_eog(id)) {
      kinds.push_back(Kind::Eog);
    } else if (tok.vocab().type(id) == moe::tokenizer::TokenType::kControl) {
      kinds.push_back(Kind::Never);
    } else {
      kinds.push_back(Kind::Text);
    }
  }
  return std::make_shared<TokenBytes>(std::move(bytes), std::move(kinds));
}

struct Qwen {
  moe::gguf::GgufFile file = moe::gguf::GgufFile::open(
      (moe::test::testdata_dir() / "models" / "qwen3-vocab-only.gguf").string());
  moe::tokenizer::Tokenizer tok = moe::tokenizer::Tokenizer::from_gguf(file);
  std::shared_ptr<const TokenBytes> vocab = qwen_vocab(tok);
};
const Qwen& qwen() {  // loaded once for the tests that use it
  static const Qwen q;
  return q;
}

TEST(GrammarMask, QwenVocabularyMatchesBruteForce) {
  const auto& tok = qwen().tok;
  const auto& vocab = qwen().vocab;
  ASSERT_EQ(vocab->size(), 151936);
  const auto g = Grammar::parse(kJson);
  const std::string doc =
      "{\"name\": \"Zoë Müller\", \"age\": 42, \"scores\": [1.5, -3e10, 0],\n \"tags\": "
      "[\"a\\\"b\", \"日本語\"], \"ok\": true, \"none\": null}";
  const auto ids = tok.encode(doc, false);
  ASSERT_TRUE(matches(g, doc));
  // States along the document at random positions (in strings, between keys, in numbers), then
  // a random continuation from the mask.
  std::mt19937 rng(42);
  GrammarMatcher m(g, vocab), shadow(g, vocab);
  size_t checked = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i == 0 || rng() % 8 == 0) {
      const auto mask = m.allowed();
      const std::vector<uint64_t> got(mask.begin(), mask.end());
      const auto want = brute_force(shadow, *vocab);
      ASSERT_EQ(got, want) << "before token " << i << diff(got, want, *vocab);
      ++checked;
    }
    m.accept(ids[i]);
    shadow.accept(ids[i]);
  }
  EXPECT_TRUE(m.can_end());
  EXPECT_GE(checked, 4u);
  GrammarMatcher r(g, vocab), r_shadow(g, vocab);
  for (int step = 0; step < 4; ++step) {
    const std::vector<uint64_t> got(r.allowed().begin(), r.allowed().end());
    ASSERT_EQ(got, brute_force(r_shadow, *vocab)) << "random step " << step;
    const int32_t t = pick_allowed(got, vocab->size(), rng);
    ASSERT_GE(t, 0);
    if (vocab->kind(t) == Kind::Eog) break;
    r.accept(t);
    r_shadow.accept(t);
  }
}

}  // namespace
}  // namespace moe::grammar

namespace moe::grammar {
namespace {

// States a JSON document does not reach: the start of a walk inside a character (a token ended
// there), classes that split the multi-byte characters, a loop over every character.
TEST(GrammarMask, QwenVocabularyOtherStates) {
  const auto& vocab = qwen().vocab;
  struct State {
    const char* gbnf;
    std::string prefix;
  };
  const State states[] = {
      {kJson, "{\"k\": \"\xe6"},              // after the first byte of a CJK character in a string
      {kJson, "[\"\xf0\x9f"},                 // two bytes into an emoji
      {"root ::= [^a-zé\"]* \"\\\"\"", "X"},  // a negated class with non-ASCII members
      {"root ::= .*", "ab"},                  // everything loops
      {"root ::= [α-ω ]+ | \"😀\"{2}", ""},    // only some multi-byte characters
  };
  for (const auto& st : states) {
    const auto g = Grammar::parse(st.gbnf);
    GrammarMatcher m(g, vocab);
    ASSERT_TRUE(m.accept_bytes(st.prefix)) << st.gbnf;
    const GrammarMatcher shadow(m);
    const std::vector<uint64_t> got(m.allowed().begin(), m.allowed().end());
    const auto want = brute_force(shadow, *vocab);
    EXPECT_EQ(got, want) << st.gbnf << " after '" << st.prefix << "'" << diff(got, want, *vocab);
  }
}

}  // namespace
}  // namespace moe::grammar
