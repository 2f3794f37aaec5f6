// Constrained generation: a GBNF grammar (llama.cpp's grammar format, so users' grammars work)
// compiled once, and a matcher that turns one generation's position in it into a mask over the
// tokenizer's vocabulary. Grammars come from requests: every size is bounded before it is walked,
// and a grammar that is wrong or too large is refused with a moe::Error naming line and column.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moe::grammar {

struct GrammarLimits {
  size_t max_text_bytes = 256u << 10;  // the GBNF text
  size_t max_rules = 8192;             // after repetitions and groups became rules
  size_t max_elements = 1u << 20;      // symbols over all rules
  size_t max_nesting = 64;             // parentheses inside one rule
  size_t max_repeat = 10000;           // the bounds of x{m,n}
  size_t max_stacks = 4096;            // live parse stacks of a matcher (ambiguity)
};

class GrammarImpl;  // the compiled rules (grammar_impl.h)

// A parsed, compiled GBNF grammar. Immutable and shareable between threads and matchers.
class Grammar {
 public:
  // Parses `gbnf` and checks it: every referenced rule defined, `root` present, no left recursion,
  // the limits. Throws moe::Error("grammar: line L, column C: ...") otherwise.
  static std::shared_ptr<const Grammar> parse(std::string_view gbnf, std::string_view root = "root",
                                              const GrammarLimits& limits = {});

  const GrammarImpl& impl() const { return *impl_; }
  const GrammarLimits& limits() const { return limits_; }
  ~Grammar();

 private:
  Grammar(std::unique_ptr<GrammarImpl> impl, GrammarLimits limits);
  std::unique_ptr<GrammarImpl> impl_;
  GrammarLimits limits_;
};

// The vocabulary as a matcher sees it: each token's bytes and what kind of token it is. Built
// once per tokenizer and shared (it holds the prefix tree the masks are computed over).
class TokenBytes {
 public:
  enum class Kind : uint8_t {
    Text,   // its bytes are output text
    Eog,    // ends generation: allowed exactly when the grammar can end
    Never,  // a control token that is not text: never allowed under a grammar
  };
  TokenBytes(std::vector<std::string> bytes, std::vector<Kind> kinds);
  ~TokenBytes();
  int32_t size() const;
  std::string_view bytes(int32_t id) const;
  Kind kind(int32_t id) const;
  struct Trie;  // grammar_matcher.cpp
  const Trie& trie() const { return *trie_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<Kind> kinds_;
  std::unique_ptr<Trie> trie_;
};

class MatcherState;  // grammar_matcher.cpp

// One generation's position in a grammar.
class GrammarMatcher {
 public:
  // `vocab` may be null for a byte-level matcher (accept_bytes only; allowed() throws).
  GrammarMatcher(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const TokenBytes> vocab);
  ~GrammarMatcher();
  // A copy continues independently from the same position (a test's brute-force check, a
  // speculative branch); it copies the memoized steps and cached masks too.
  GrammarMatcher(const GrammarMatcher& other);
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  // The tokens allowed next, as a bitset over token ids (bit i%64 of word i/64; ceil(n_vocab/64)
  // words). Valid until the next accept. Masks are cached by parser state, so a state seen before
  // (the inside of a JSON string, between keys) costs a lookup.
  std::span<const uint64_t> allowed();

  // Advances by one token. Throws moe::Error when the token is not allowed (state unchanged).
  void accept(int32_t token);

  // Advances by raw bytes (a token's or a test's); false, with the state unchanged, when the
  // grammar refuses them. Bytes may end inside a UTF-8 character.
  bool accept_bytes(std::string_view bytes);

  // The text so far is a complete sentence of the grammar (an end-of-generation token is allowed).
  bool can_end() const;
  // Nothing but the end can follow.
  bool must_end() const;

 private:
  std::unique_ptr<MatcherState> s_;
};

// True when `text` is a complete sentence of `grammar` (tests and the converters' checks).
bool matches(std::shared_ptr<const Grammar> grammar, std::string_view text);

}  // namespace moe::grammar
