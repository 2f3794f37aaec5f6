// GrammarMatcher: one generation's position (a state of the StackMachine) and the token masks,
// computed by walking the vocabulary's prefix tree with the machine and cached per state.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "coordinator/grammar/grammar.h"
#include "coordinator/grammar/stack_machine.h"
#include "coordinator/grammar/token_trie.h"

namespace moe::grammar {

namespace {
constexpr size_t kMaskCacheEntries = 32;
}  // namespace

class MatcherState {
 public:
  MatcherState(std::shared_ptr<const Grammar> g, std::shared_ptr<const TokenBytes> v)
      : grammar(std::move(g)),
        vocab(std::move(v)),
        machine(std::make_unique<StackMachine>(*grammar)) {
    state = machine->initial();
  }
  MatcherState(const MatcherState& o)
      : grammar(o.grammar),
        vocab(o.vocab),
        machine(std::make_unique<StackMachine>(*o.machine)),
        state(o.state),
        ended(o.ended),
        cache(o.cache),
        tick(o.tick) {}

  // Between tokens: a machine grown past its bounds starts over from the current state (its
  // memoized steps and the cached masks, keyed by its state ids, go with it).
  void keep_bounded() {
    if (!machine->oversized()) return;
    auto fresh = std::make_unique<StackMachine>(*grammar);
    state = machine->rebuild_into(*fresh, state);
    machine = std::move(fresh);
    cache.clear();
  }

  std::span<const uint64_t> allowed();
  void walk(std::vector<uint64_t>& mask);

  std::shared_ptr<const Grammar> grammar;
  std::shared_ptr<const TokenBytes> vocab;
  std::unique_ptr<StackMachine> machine;
  int32_t state = 0;
  bool ended = false;  // an end-of-generation token was accepted

  struct Entry {
    int32_t state;
    uint64_t used;
    std::vector<uint64_t> mask;
  };
  std::vector<Entry> cache;  // LRU, kMaskCacheEntries at most
  uint64_t tick = 0;
  std::vector<int32_t> walk_states;  // per tree depth, during a walk
  std::vector<uint64_t> none;        // the mask after the end
};

// Every token whose bytes the machine can step through from `state`: one step per tree node, and a
// dead node skips its subtree. Partial UTF-8 at a token's end is a live state when some allowed
// character can start with those bytes (StackMachine keeps them pending).
void MatcherState::walk(std::vector<uint64_t>& mask) {
  const TokenBytes::Trie& t = vocab->trie();
  StackMachine& m = *machine;
  walk_states.resize(static_cast<size_t>(t.max_depth) + 1);
  walk_states[0] = state;
  const auto* nodes = t.nodes.data();
  const uint32_t n = static_cast<uint32_t>(t.nodes.size() - 1);  // the last is a sentinel
  // Whole subtrees with multi-byte characters only when the tree's character boundaries are the
  // walk's (no partial character at the start).
  const uint64_t multi_ok = m.pending(state) ? ~kMultiByteGroup : ~0ull;
  uint32_t i = 1;
  while (i < n) {
    const TokenBytes::Trie::Node& nd = nodes[i];
    const int32_t s = m.step(walk_states[nd.depth - 1u], nd.byte);
    if (s == StackMachine::kDead) {
      i = nd.end;
      continue;
    }
    walk_states[nd.depth] = s;
    // All of the subtree when the state loops to itself on every byte below (see byte_group).
    const bool whole = nd.below != 0 && (nd.below & ~(m.loop_groups(s) & multi_ok)) == 0 &&
                       !((nd.below & kMultiByteGroup) && nd.bad_utf8_below);
    const uint32_t next = whole ? nd.end : i + 1;
    for (uint32_t k = nd.tok_begin, e = nodes[next].tok_begin; k < e; ++k) {
      const auto id = static_cast<uint32_t>(t.tokens[k]);
      mask[id >> 6] |= 1ull << (id & 63);
    }
    i = next;
  }
  if (m.can_end(state)) {
    for (int32_t id : t.eog) mask[static_cast<uint32_t>(id) >> 6] |= 1ull << (id & 63);
  }
}

std::span<const uint64_t> MatcherState::allowed() {
  if (!vocab) throw moe::Error("grammar: allowed() needs a vocabulary (this matcher has none)");
  const size_t words = (static_cast<size_t>(vocab->size()) + 63) / 64;
  if (ended) {
    none.assign(words, 0);
    return none;
  }
  keep_bounded();
  ++tick;
  for (Entry& e : cache) {
    if (e.state == state) {
      e.used = tick;
      return e.mask;
    }
  }
  Entry* slot;
  if (cache.size() < kMaskCacheEntries) {
    slot = &cache.emplace_back();
  } else {
    slot = &*std::min_element(cache.begin(), cache.end(),
                              [](const Entry& a, const Entry& b) { return a.used < b.used; });
  }
  slot->state = -1;  // not valid until the walk is done (it may throw)
  slot->mask.assign(words, 0);
  walk(slot->mask);
  slot->state = state;
  slot->used = tick;
  return slot->mask;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar,
                               std::shared_ptr<const TokenBytes> vocab) {
  if (!grammar) throw moe::Error("grammar: GrammarMatcher needs a grammar");
  s_ = std::make_unique<MatcherState>(std::move(grammar), std::move(vocab));
}

GrammarMatcher::GrammarMatcher(const GrammarMatcher& other)
    : s_(std::make_unique<MatcherState>(*other.s_)) {}

GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

std::span<const uint64_t> GrammarMatcher::allowed() { return s_->allowed(); }

void GrammarMatcher::accept(int32_t token) {
  if (!s_->vocab)
    throw moe::Error("grammar: accept(token) needs a vocabulary (this matcher has none)");
  if (token < 0 || token >= s_->vocab->size()) {
    throw moe::Error("grammar: token " + std::to_string(token) + " is out of the vocabulary");
  }
  const auto kind = s_->vocab->kind(token);
  const auto bytes = s_->vocab->bytes(token);
  if (s_->ended) throw moe::Error("grammar: token " + std::to_string(token) + " after the end");
  if (kind == TokenBytes::Kind::Eog) {
    if (!can_end()) {
      throw moe::Error("grammar: end-of-generation token " + std::to_string(token) +
                       " before the grammar is complete");
    }
    s_->ended = true;
    return;
  }
  if (kind == TokenBytes::Kind::Never || bytes.empty() || !accept_bytes(bytes)) {
    throw moe::Error("grammar: token " + std::to_string(token) + " is not allowed here");
  }
}

bool GrammarMatcher::accept_bytes(std::string_view bytes) {
  if (s_->ended) return bytes.empty();
  s_->keep_bounded();
  StackMachine& m = *s_->machine;
  int32_t s = s_->state;
  for (char c : bytes) {
    s = m.step(s, static_cast<uint8_t>(c));
    if (s == StackMachine::kDead) return false;
  }
  s_->state = s;
  return true;
}

bool GrammarMatcher::can_end() const { return !s_->ended && s_->machine->can_end(s_->state); }

bool GrammarMatcher::must_end() const { return !s_->ended && s_->machine->must_end(s_->state); }

bool matches(std::shared_ptr<const Grammar> grammar, std::string_view text) {
  GrammarMatcher m(std::move(grammar), nullptr);
  return m.accept_bytes(text) && m.can_end();
}

}  // namespace moe::grammar
