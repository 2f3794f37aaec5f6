// moe-bench-grammar: the cost per token of grammar-constrained generation (GrammarMatcher::allowed
// and accept) with a real vocabulary. A generic JSON grammar is driven through a fixed JSON
// document tokenized by the model's tokenizer, so positions cover the inside of strings, the
// places between keys and numbers. Three measurements per position:
//   cold        a fresh matcher brought to the position (not timed): nothing memoized or cached;
//   generation  one matcher through the whole document, as one request would run;
//   warm        each position again, on a copy of the generation's matcher with its mask cached.
// Usage: moe-bench-grammar <vocab.gguf> [passes]   (pin it to one core: taskset -c 0 ...)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/gguf.h"
#include "coordinator/grammar/grammar.h"
#include "coordinator/tokenizer/tokenizer.h"

namespace {

using moe::grammar::GrammarMatcher;
using moe::grammar::TokenBytes;
using Clock = std::chrono::steady_clock;

// JSON (RFC 8259) with whitespace bounded to a few characters between tokens.
constexpr const char* kJsonGrammar = R"(root ::= ws value ws
value ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( ws "," ws member )* )? ws "}"
member ::= string ws ":" ws value
array ::= "[" ws ( value ( ws "," ws value )* )? ws "]"
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1f] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]* ) ( "." [0-9]+ )? ( [eE] [-+]? [0-9]+ )?
ws ::= [ \t\n]{0,20}
)";

constexpr const char* kDocument = R"({
  "id": "req-7f3a9c21",
  "model": "qwen3-30b-a3b",
  "created": 1718035200,
  "user": {"name": "Zoë Müller-Østergaard", "email": "zoe@example.org", "age": 37,
           "verified": true, "roles": ["admin", "editor"], "manager": null},
  "items": [
    {"sku": "A-100", "title": "Wireless keyboard, compact layout", "qty": 2, "price": 49.99},
    {"sku": "B-220", "title": "USB-C hub (7 ports) \"pro\" edition", "qty": 1, "price": 89.5},
    {"sku": "C-031", "title": "Ergonomic mouse — left-handed", "qty": 3, "price": 1.25e2}
  ],
  "notes": "Deliver between 9:00 and 17:00.\nCall ahead: +49 30 1234567. 日本語のメモも可。",
  "totals": {"subtotal": 563.48, "tax": -0.0, "discount": 12, "currency": "EUR"},
  "tags": ["priority", "gift", "fragile", "b2b", "repeat-customer"],
  "history": [[1, 2, 3], [], [{"k": "v"}], {"nested": {"deeper": {"deepest": [false, true]}}}]
}
)";

enum Where { kInString, kBetween, kNumber, kWhereCount };
constexpr const char* kWhereName[] = {"in a string", "between keys/values", "in a number"};

// Where each byte of the document is (for the position a token starts at).
std::vector<Where> classify(const std::string& doc) {
  std::vector<Where> out(doc.size(), kBetween);
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < doc.size(); ++i) {
    const char c = doc[i];
    if (in_string) {
      out[i] = kInString;
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if ((c >= '0' && c <= '9') || c == '-' || c == '.' || c == 'e' || c == '+') {
      out[i] = (c == 'e' && !(i > 0 && out[i - 1] == kNumber)) ? kBetween : kNumber;
    }
  }
  return out;
}

struct Stats {
  std::vector<double> us;
  void print(const char* what) {
    if (us.empty()) return;
    std::vector<double> s = us;
    std::sort(s.begin(), s.end());
    double sum = 0;
    for (double v : s) sum += v;
    const auto at = [&](double q) {
      return s[std::min(s.size() - 1, static_cast<size_t>(q * s.size()))];
    };
    std::printf("  %-22s n=%5zu  mean %8.1f  median %8.1f  p99 %8.1f  max %8.1f us/token\n", what,
                s.size(), sum / s.size(), at(0.5), at(0.99), s.back());
  }
};

// allowed() and accept(token); `copies` gets the matcher between them (its mask cached).
double time_step(GrammarMatcher& m, int32_t token, std::vector<GrammarMatcher>* copies = nullptr) {
  auto t0 = Clock::now();
  const auto mask = m.allowed();
  if (copies) {
    const auto t1 = Clock::now();
    copies->push_back(m);
    t0 += Clock::now() - t1;  // the copy is not the matcher's cost
  }
  if (!((mask[static_cast<size_t>(token) >> 6] >> (token & 63)) & 1)) {
    throw moe::Error("bench: the grammar refuses token " + std::to_string(token));
  }
  m.accept(token);
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: moe-bench-grammar <vocab.gguf> [passes]\n");
    return 2;
  }
  const int passes = argc > 2 ? std::max(1, std::atoi(argv[2])) : 3;
  const auto file = moe::gguf::GgufFile::open(argv[1]);
  const auto tok = moe::tokenizer::Tokenizer::from_gguf(file);
  std::vector<std::string> bytes;
  std::vector<TokenBytes::Kind> kinds;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    bytes.push_back(tok.token_piece(id, true));
    kinds.push_back(tok.is_eog(id) ? TokenBytes::Kind::Eog
                    : tok.vocab().type(id) == moe::tokenizer::TokenType::kControl
                        ? TokenBytes::Kind::Never
                        : TokenBytes::Kind::Text);
  }
  auto t0 = Clock::now();
  const auto vocab = std::make_shared<const TokenBytes>(std::move(bytes), std::move(kinds));
  const double build_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  const auto grammar = moe::grammar::Grammar::parse(kJsonGrammar);

  const std::string doc = kDocument;
  const auto ids = tok.encode(doc, false);
  const auto where_byte = classify(doc);
  std::vector<Where> where;
  size_t offset = 0;
  for (int32_t id : ids) {
    where.push_back(where_byte[std::min(offset, doc.size() - 1)]);
    offset += tok.token_piece(id, false).size();
  }
  std::printf(
      "vocabulary %d tokens (prefix tree built in %.1f ms); document %zu bytes, %zu tokens\n",
      vocab->size(), build_ms, doc.size(), ids.size());

  Stats cold[kWhereCount + 1], gen[kWhereCount + 1], warm[kWhereCount + 1];
  for (int pass = 0; pass < passes; ++pass) {
    for (size_t i = 0; i < ids.size(); ++i) {
      GrammarMatcher m(grammar, vocab);
      for (size_t k = 0; k < i; ++k) m.accept_bytes(vocab->bytes(ids[k]));
      const double us = time_step(m, ids[i]);
      cold[where[i]].us.push_back(us);
      cold[kWhereCount].us.push_back(us);
    }
    GrammarMatcher m(grammar, vocab);
    std::vector<GrammarMatcher> before;
    for (size_t i = 0; i < ids.size(); ++i) {
      const double us = time_step(m, ids[i], &before);
      gen[where[i]].us.push_back(us);
      gen[kWhereCount].us.push_back(us);
    }
    for (size_t i = 0; i < ids.size(); ++i) {  // the masks are cached there now
      const double us = time_step(before[i], ids[i]);
      warm[where[i]].us.push_back(us);
      warm[kWhereCount].us.push_back(us);
    }
    if (!m.can_end()) throw moe::Error("bench: the document is not complete under the grammar");
  }
  for (auto [name, stats] :
       {std::pair{"cold (nothing cached)", cold}, std::pair{"generation (one matcher)", gen},
        std::pair{"warm (mask cached)", warm}}) {
    std::printf("%s, allowed() + accept():\n", name);
    for (int w = 0; w < kWhereCount; ++w) stats[w].print(kWhereName[w]);
    stats[kWhereCount].print("all positions");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moe-bench-grammar: %s\n", e.what());
    return 1;
  }
}
