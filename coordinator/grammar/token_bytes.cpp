// TokenBytes: the vocabulary's bytes and kinds, and the prefix tree the masks are computed over.
#include <algorithm>
#include <numeric>
#include <string>
#include <utility>

#include "common/error.h"
#include "coordinator/grammar/grammar.h"
#include "coordinator/grammar/token_trie.h"

namespace moe::grammar {
namespace {

// A UTF-8 decoder's position: continuation bytes still due and the range the next must be in.
struct Utf8 {
  uint8_t left = 0, lo = 0x80, hi = 0xBF;
  bool bad = false;
  Utf8 next(uint8_t b) const {
    Utf8 n;
    if (bad) {
      n.bad = true;
    } else if (left > 0) {
      n.bad = b < lo || b > hi;
      n.left = static_cast<uint8_t>(left - 1);
    } else if (b >= 0x80) {
      n.left = b >= 0xC2 && b <= 0xDF   ? 1
               : b >= 0xE0 && b <= 0xEF ? 2
               : b >= 0xF0 && b <= 0xF4 ? 3
                                        : 0;
      n.bad = n.left == 0;
      n.lo = b == 0xE0 ? 0xA0 : b == 0xF0 ? 0x90 : 0x80;  // no overlong forms
      n.hi = b == 0xED ? 0x9F : b == 0xF4 ? 0x8F : 0xBF;  // no surrogates, nothing past U+10FFFF
    }
    return n;
  }
};

}  // namespace

TokenBytes::TokenBytes(std::vector<std::string> bytes, std::vector<Kind> kinds)
    : bytes_(std::move(bytes)), kinds_(std::move(kinds)), trie_(std::make_unique<Trie>()) {
  if (bytes_.size() != kinds_.size()) {
    throw moe::Error("grammar: TokenBytes: " + std::to_string(bytes_.size()) +
                     " token byte strings but " + std::to_string(kinds_.size()) + " kinds");
  }
  if (bytes_.size() > static_cast<size_t>(INT32_MAX))
    throw moe::Error("grammar: TokenBytes: too many tokens");
  Trie& t = *trie_;
  std::vector<int32_t> text;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    const auto id = static_cast<int32_t>(i);
    if (kinds_[i] == Kind::Eog) t.eog.push_back(id);
    if (kinds_[i] != Kind::Text || bytes_[i].empty()) continue;  // never allowed
    if (bytes_[i].size() > UINT16_MAX) {
      throw moe::Error("grammar: TokenBytes: token " + std::to_string(i) +
                       " is longer than 65535 bytes");
    }
    text.push_back(id);
  }
  // Sorted byte strings give the tree in preorder: a token's node is made just before the tokens
  // ending there are recorded, and a string's prefixes sort before it.
  std::sort(text.begin(), text.end(), [&](int32_t a, int32_t b) {
    if (bytes_[a] != bytes_[b]) return bytes_[a] < bytes_[b];
    return a < b;
  });
  t.nodes.push_back({0, 0, 0, 0, 0, false});
  std::vector<uint32_t> path{0};   // node per depth along the current string
  std::vector<Utf8> utf8{Utf8{}};  // the decoder after each node of the path
  const auto close = [&] {         // the subtree of path.back() is complete
    const Trie::Node done = t.nodes[path.back()];
    t.nodes[path.back()].end = static_cast<uint32_t>(t.nodes.size());
    const bool bad = utf8.back().bad || done.bad_utf8_below;
    path.pop_back();
    utf8.pop_back();
    if (!path.empty()) {
      t.nodes[path.back()].below |= byte_group(done.byte) | done.below;
      t.nodes[path.back()].bad_utf8_below |= bad;
    }
  };
  std::string_view prev;
  for (int32_t id : text) {
    const std::string_view cur = bytes_[id];
    size_t common = 0;
    while (common < prev.size() && common < cur.size() && prev[common] == cur[common]) ++common;
    while (path.size() > common + 1) close();  // the subtrees the new string leaves
    for (size_t d = common; d < cur.size(); ++d) {
      path.push_back(static_cast<uint32_t>(t.nodes.size()));
      utf8.push_back(utf8.back().next(static_cast<uint8_t>(cur[d])));
      t.nodes.push_back({0, 0, static_cast<uint32_t>(t.tokens.size()), static_cast<uint16_t>(d + 1),
                         static_cast<uint8_t>(cur[d]), false});
    }
    t.tokens.push_back(id);
    t.max_depth = std::max(t.max_depth, static_cast<uint16_t>(cur.size()));
    prev = cur;
  }
  while (!path.empty()) close();
  t.nodes.push_back({0, 0, static_cast<uint32_t>(t.tokens.size()), 0, 0, false});  // sentinel
}

TokenBytes::~TokenBytes() = default;

int32_t TokenBytes::size() const { return static_cast<int32_t>(bytes_.size()); }

std::string_view TokenBytes::bytes(int32_t id) const { return bytes_.at(static_cast<size_t>(id)); }

TokenBytes::Kind TokenBytes::kind(int32_t id) const { return kinds_.at(static_cast<size_t>(id)); }

}  // namespace moe::grammar
